/* fm_proto.h: protocol constants and the message schemas (PROTOCOL.md is the prose).
 *
 * Every frame (fm_frame.h) carries one msgpack map. Requests: {op: str, id: u64, ...};
 * replies echo id and carry ok: bool. Failures: {ok:false, id, code, message, detail}
 * (fm_pack_error_reply; code is an fm_err slug). Requests on one connection are answered in
 * any order (match by id), so a client may pipeline many.
 *
 *  hello   {proto: u32, client: str(<=64), pid: u64}
 *       -> {proto, server: "fusemld", version: str, mode: "gpu"|"compile-only",
 *           device: {name, cc: [major, minor], sm_count, arch}, vocab, codegen,
 *           nvrtc: [major, minor], max_frame: u32}
 *          Must be the first request on a connection (only ping may precede it);
 *          anything else first gets handshake_required. A proto we do not speak gets
 *          protocol_version and the connection is closed after the reply.
 *  ping    {} -> {pong: true}
 *  compile {fragment: map, arch?: str}
 *       -> {key: hex64, kind, state: "verified"|"tuned"|"untuned", origin: "hit"|"compiled"|"joined",
 *           meta: map (fm_meta.h), cubin: bin}
 *          Concurrent compiles of one key share one NVRTC run ("joined").
 *          compile_failed carries NVRTC's log in detail.
 *  lookup  {fragment: map} | {key: hex64}  -> as compile with origin "hit", or not_found.
 *  stats   {} -> {mode, device, uptime_s, clients, inflight, tune, background_tunes, entries, bytes,
 *                 stats: {name: i64, ...} (persistent, FM_STAT_MAP), session: {...} (since start)}
 *  list    {limit?: u32} -> {entries: [{key, device, kind, state, size, hits, created, last_used}]}
 *  show    {key: hex prefix of >= 4 digits}
 *       -> {entry: {key, device, kind, state, size, hits, created, last_used,
 *                   fragment: map (canonical), meta: map, source: str, timings: map|nil,
 *                   background: {phase, ahead, candidates}|nil}}
 *  evict   {key: hex64} | {all: true} -> {evicted: u64}
 */
#ifndef FM_PROTO_H
#define FM_PROTO_H

#define FM_PROTO_VERSION   1
#define FM_VERSION_STRING  "0.1.0"
#define FM_CLIENT_NAME_MAX 64

#endif
