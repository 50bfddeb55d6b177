/* fm_remote_cmd.c: export and import, one portable entry (fm_remote_entry.h) per request.
 *
 *   export {key: hex64}  -> {key, entry: bin}        signed with the cluster secret if set
 *   import {entry: bin}  -> {key, imported: bool, skipped?: str}
 *                           verified like a remote hit, then stored unless the import rule
 *                           (fm_remote_tier.c) skips it; admin only (fm_dispatch.c)
 *
 * An import is bounded by the request frame (FM_FRAME_MAX_REQUEST): larger entries are
 * refused by the framing before they get here. */
#include <stdlib.h>
#include <string.h>

#include "fm_commands.h"
#include "fm_log.h"
#include "fm_msg.h"
#include "fm_remote_tier.h"
#include "fm_reply.h"

int fm_cmd_export(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  const char *hex;
  size_t hex_len;
  fm_key key;
  uint8_t *val = NULL;
  size_t len = 0;
  int err = fm_msg_get_str(rq->msg, "key", &hex, &hex_len, d);
  if (err == FM_ENOT_FOUND) return fm_diag_set(d, FM_ESCHEMA, "export needs \"key\"");
  if (err) return err;
  if (fm_key_from_hex(hex, hex_len, &key)) return fm_diag_set(d, FM_ESCHEMA, "\"key\" must be 64 hex digits");
  if ((err = fm_remote_tier_export(dd->remote, &key, &val, &len, d))) return err;
  fm_reply r;
  fm_reply_begin(&r, rq->id, 2);
  fm_pack_cstr(&r.pk, "key");
  fm_reply_pack_key(&r.pk, &key);
  fm_pack_cstr(&r.pk, "entry");
  fm_pack_bin(&r.pk, val, len);
  fm_reply_send(&r, rq->conn, rq->id);
  free(val);
  return FM_OK;
}

int fm_cmd_import(fm_request *rq, fm_diag *d) {
  fm_daemon *dd = rq->dd;
  const uint8_t *val;
  size_t len;
  fm_key key;
  char hex[FM_KEY_HEX];
  int err = fm_msg_get_bin(rq->msg, "entry", &val, &len, d);
  if (err == FM_ENOT_FOUND) return fm_diag_set(d, FM_ESCHEMA, "import needs \"entry\"");
  if (err) return err;
  const char *skipped = NULL;
  memset(&key, 0, sizeof key);
  err = fm_remote_tier_import(dd->remote, val, len, &key, &skipped, d);
  fm_key_to_hex(&key, hex);
  if (err) {
    fm_log_warn("%s: import of %.16s refused: %s", fm_conn_name(rq->conn), hex, d->text);
    return err;
  }
  if (skipped)
    fm_log_info("%s: import of %.16s skipped: %s", fm_conn_name(rq->conn), hex, skipped);
  else
    fm_log_info("%s: imported %.16s", fm_conn_name(rq->conn), hex);
  fm_reply r;
  fm_reply_begin(&r, rq->id, skipped ? 3 : 2);
  fm_pack_cstr(&r.pk, "key");
  fm_reply_pack_key(&r.pk, &key);
  fm_pack_kv_bool(&r.pk, "imported", !skipped);
  if (skipped) fm_pack_kv_cstr(&r.pk, "skipped", skipped);
  fm_reply_send(&r, rq->conn, rq->id);
  return FM_OK;
}
