/* fm_entry_check.h: whether an entry this daemon did not just build itself (an import, a
 * remote hit, a row found by key) is one it would have built: its key is the fingerprint of
 * its canonical fragment on its device, and every blob that is served or spliced into a reply
 * is what the generator writes. Pure functions, any thread. */
#ifndef FM_ENTRY_CHECK_H
#define FM_ENTRY_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "fm_device.h"
#include "fm_error.h"
#include "fm_fingerprint.h"
#include "fm_store.h"

/* The key this daemon computes for canonical bytes on the device that label names (a label
 * of one of its own targets, fm_device_label). FM_EINVAL (reason in d) for a label this
 * daemon does not target; FM_ENOMEM. */
int fm_entry_expected_key(const fm_devinfo *dev, const char *label, const uint8_t *canonical, size_t canonical_len,
                          fm_key *key, fm_diag *d);

/* Checks e's content as strictly as the generator's own output: the state is an fm_kstate;
 * canonical is one canonical fragment (it decodes, validates and re-canonicalizes to the same
 * bytes); meta is one map that fm_meta_unpack accepts, of e's kind, with the fragment's
 * number of inputs and outputs; timings is empty or one map. FM_EINVAL with the first fault
 * in d; FM_ENOMEM. */
int fm_entry_check_content(const fm_entry *e, fm_diag *d);

#endif
