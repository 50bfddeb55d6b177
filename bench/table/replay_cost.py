"""The host cost of fuseml's CUDA-graph replay, piece by piece (where its host time goes): a
graph of one kernel (out = x + 1, x 16384 x 256 bf16, four more inputs at fixed addresses, as a
compiled MLP block has) replayed by torch's CUDAGraph and by graph_replay.GraphReplay, and
the pieces of GraphReplay's call timed alone. Host microseconds per call: perf_counter over
calls issued back to back (one sync after), median of 7 rounds, the rows interleaved in each
round (the device hosts drift by tens of percent within a minute).

    python3 bench/table/replay_cost.py     (on the device; bench/table/run-device replay)"""

import statistics
import time

import torch

from fuseml import cudagraphs, graph_replay


def host_us(fn, n=2000):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return t


def main():
    dev = torch.device("cuda")
    x = torch.randn(16384, 256, device=dev, dtype=torch.bfloat16)
    params = [
        torch.randn(1024, 256, device=dev, dtype=torch.bfloat16),
        torch.randn(1024, device=dev, dtype=torch.bfloat16),
        torch.randn(256, 1024, device=dev, dtype=torch.bfloat16),
        torch.randn(256, device=dev, dtype=torch.bfloat16),
    ]
    args = params[:2] + [x] + params[2:]  # the MLP graph's order: x third

    def graph_fn(a):
        return [torch.add(a[2], 1.0)]

    replay = graph_replay.GraphReplay(graph_fn, {0, 1, 3, 4}, dev.index or 0)
    boxed = cudagraphs._boxed(replay)
    for _ in range(3):  # warm-up, record, replay
        outs = replay(list(args))
    del outs
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = graph_fn(args)
    rec = next(iter(replay.direct.values()))[0]
    static = replay.static
    base_replay = torch._C._CUDAGraph.replay
    rows = [
        ("eager torch.add(x, 1.0) launch", lambda: torch.add(x, 1.0)),
        ("torch CUDAGraph.replay()", g.replay),
        ("torch._C._CUDAGraph.replay(g)", lambda: base_replay(g)),
        ("GraphReplay(args) (the whole replay)", lambda: replay(list(args))),
        ("boxed run(args) -> GraphReplay", lambda: boxed(list(args))),
        ("piece: _direct_key", lambda: graph_replay._direct_key(args, static)),
        ("piece: _Recorded.free", rec.free),
        ("piece: torch.cuda.current_device()", torch.cuda.current_device),
        ("piece: _Recorded.replay", lambda: rec.replay(args)),
        ("piece: output.detach()", y[0].detach),
    ]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    times = {name: [] for name, _ in rows}
    for _ in range(7):
        for name, fn in rows:
            times[name].append(host_us(fn))
    for name, _ in rows:
        print(f"  {name:40s} {statistics.median(times[name]):7.2f} us")


if __name__ == "__main__":
    main()
