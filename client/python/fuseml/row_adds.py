"""Rows added into a buffer at indices, by atomic adds: the form of it that ATen runs fastest.

    add_rows_(buffer, idx, rows) -> buffer    # buffer[idx[j]] += rows[j] for every j, in place

`index_add_` is the obvious spelling, but its CUDA kernel (`indexFuncLargeIndex`) works out each
element's offsets by division one element at a time: 50 us for 8192 rows of 1024 fp32 on an
H200 (the MoE decoder's gathered rows' gradient), where `scatter_add_` with the index broadcast
along the rows (stride 0: nothing is materialised) takes 21 us for the same atomic adds, eight
elements a thread, its offsets by precomputed dividers (bench/NOTES.md, "The MoE decoder's
zeroed rows"). Both add in whatever order the atomics land: callers keep ATen's sorted,
reproducible forms under deterministic algorithms."""


def add_rows_(buffer, idx, rows):
    """buffer (2-D or more, rows along dim 0) with rows[j] added to its row idx[j], in place;
    rows of buffer's dtype and shape [len(idx), *buffer.shape[1:]], idx 1-D int32/int64."""
    index = idx.long().reshape((-1,) + (1,) * (rows.dim() - 1)).expand(rows.shape)
    return buffer.scatter_add_(0, index, rows)
