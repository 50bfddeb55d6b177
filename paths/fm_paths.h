/* fm_paths.h: where things live by default (shared by the daemon, fusectl and libfusemld).
 *  socket, per user:  $XDG_RUNTIME_DIR/fusemld.sock, else /tmp/fusemld-<uid>/fusemld.sock
 *                     (that directory created 0700 and refused if it is not ours)
 *  socket, system:    /run/fusemld/fusemld.sock
 *  database, per user: $XDG_CACHE_HOME/fusemld/kernels.db, else ~/.cache/fusemld/kernels.db
 *  database, system:  /var/lib/fusemld/kernels.db
 *  config:            $XDG_CONFIG_HOME/fusemld/fusemld.conf (user), /etc/fusemld/fusemld.conf
 * FUSEML_SOCKET overrides the socket path for clients. */
#ifndef FM_PATHS_H
#define FM_PATHS_H

#include <stddef.h>
#include "fm_error.h"

#define FM_SYSTEM_SOCKET "/run/fusemld/fusemld.sock"
#define FM_SYSTEM_DB     "/var/lib/fusemld/kernels.db"
#define FM_SYSTEM_CONFIG "/etc/fusemld/fusemld.conf"

/* The per-user socket path (honours FUSEML_SOCKET when from_env). With create_dirs the
 * private /tmp directory is created if needed. FM_ELIMIT if it does not fit in cap. */
int fm_default_socket_path(char *out, size_t cap, int from_env, int create_dirs, fm_diag *d);
/* The per-user database path; with create_dirs its directory is created (0700). */
int fm_default_db_path(char *out, size_t cap, int create_dirs, fm_diag *d);
/* The per-user config path (may not exist). */
int fm_default_config_path(char *out, size_t cap, fm_diag *d);
/* Refuses (FM_EDENIED, with the reason) a socket whose directory, symlinks followed, is owned
 * by anyone but this uid or root: that owner could have put an impostor daemon's socket there.
 * In a directory others may write (/tmp), the socket file must be ours or root's as well.
 * FM_OK when the directory does not exist (connecting then fails with its own message). */
int fm_check_socket_dir(const char *socket_path, fm_diag *d);
/* mkdir -p with mode for each missing component. */
int fm_mkdirs(const char *path, int mode, fm_diag *d);

#endif
