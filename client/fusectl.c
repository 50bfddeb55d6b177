/* fusectl.c: the fusemld command-line tool: global options, a static command table (as
 * Redis's), connecting, and the mapping of failures to exit codes.
 *
 * Exit codes (scripts and the end-to-end tests rely on them; `fusectl --help` lists them):
 *   0  ok
 *   1  the daemon answered with an error (its code slug is printed:
 *      "fusectl: compile_failed: NVRTC compile failed: <detail>")
 *   2  usage error
 *   3  cannot reach the daemon (or lost it mid-request)
 *   4  bad input file (unreadable, not JSON, too large or too deep)
 */
#include "fusectl.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fm_msg.h"
#include "fm_paths.h"
#include "fm_proto.h"

#define FM_CTL_TIMEOUT_SHORT 5000
#define FM_CTL_TIMEOUT_LONG  120000

static int fm_ctl_cmd_help(fm_ctl *ctl, int argc, char **argv);

/* Every command accepts --json (as the global option does) and --help. */
static const fm_ctl_cmd fm_ctl_cmds[] = {
    {"ping", fm_ctl_cmd_ping, "", "check that fusemld answers", 0,
     "Connects, says hello and pings: prints the daemon's version, socket, mode and device.\n"},
    {"stats", fm_ctl_cmd_stats, "[--zero]", "daemon and cache counters", 0,
     "Prints the daemon's mode, device, pid, uptime, database and clients, the store's entries\n"
     "and size against its cap, the hit rate, and each counter since the database was created\n"
     "(or last zeroed) beside its value since this start.\n"
     "  --zero        set every counter back to 0 (only root and the daemon's own user)\n"},
    {"ls", fm_ctl_cmd_ls, "[--limit N]", "list cached kernels, most recently used first", 0,
     "  --limit N     at most N entries (default: all, up to the daemon's 10000)\n"},
    {"show", fm_ctl_cmd_show, "KEY [--source]", "one entry (KEY: >= 4 hex digits); --source: its CUDA C", 0,
     "KEY is the entry's key or an unambiguous prefix of at least 4 hex digits (see `fusectl ls`).\n"
     "  --source      print only the stored CUDA C, so that `show KEY --source > k.cu` compiles\n"},
    {"evict", fm_ctl_cmd_evict, "KEY | --all", "remove one cached kernel, or all of them", 0,
     "KEY as for show. Only root and the daemon's own user may evict.\n"
     "  --all         remove every entry\n"},
    {"compile", fm_ctl_cmd_compile, "FRAGMENT.json [--arch ARCH]", "compile (or fetch) a fragment's kernel",
     FM_CTL_LONG,
     "FRAGMENT.json is a fragment in its JSON form (examples/ has some).\n"
     "  --arch ARCH   compile for ARCH (e.g. sm_90a) instead of the daemon's own target\n"},
    {"warm", fm_ctl_cmd_warm, "MANIFEST [--jobs N]", "compile each fragment MANIFEST lists (a path a line)",
     FM_CTL_LONG,
     "MANIFEST lists one fragment file a line (relative to the manifest's folder); blank lines\n"
     "and lines starting with # are skipped. A progress bar is drawn when stderr is a terminal.\n"
     "  --jobs N      compile requests in flight at once, each on its own connection (1 to 64;\n"
     "                default: the daemon's compile workers)\n"},
    {"export", fm_ctl_cmd_export, "FILE [--device LABEL]",
     "write the store's entries (or one device's) to FILE, a portable snapshot", FM_CTL_LONG,
     "  --device LABEL  only the entries of this device (the DEVICE column of `fusectl ls`)\n"},
    {"import", fm_ctl_cmd_import, "FILE", "send FILE's entries to fusemld, which verifies each and stores it",
     FM_CTL_LONG,
     "FILE is a snapshot from `fusectl export`. The daemon accepts only entries signed with its\n"
     "own secret (--remote-secret-file). Only root and the daemon's own user may import.\n"},
    {"shutdown", fm_ctl_cmd_shutdown, "[--no-wait]", "stop this daemon (the one on the socket) gracefully", 0,
     "The daemon stops accepting, finishes the compiles in flight (up to 30 s), answers their\n"
     "clients, closes the database and exits 0. Only root and the daemon's own user may stop it;\n"
     "other daemons (other users', other sockets) are not touched.\n"
     "  --no-wait     return once the daemon has agreed, not when it has finished\n"},
    {"help", fm_ctl_cmd_help, "[COMMAND]", "this help, or one command's", FM_CTL_LOCAL, ""},
};
#define FM_CTL_N_CMDS (sizeof fm_ctl_cmds / sizeof fm_ctl_cmds[0])

static const fm_ctl_cmd *fm_ctl_find_cmd(const char *name) {
  for (size_t i = 0; i < FM_CTL_N_CMDS; i++)
    if (strcmp(fm_ctl_cmds[i].name, name) == 0) return &fm_ctl_cmds[i];
  return NULL;
}

static void fm_ctl_cmd_usage_help(FILE *f, const fm_ctl_cmd *cmd) {
  fprintf(f, "usage: fusectl [options] %s%s%s [--json]\n\n%s.\n", cmd->name, cmd->usage[0] ? " " : "", cmd->usage,
          cmd->help);
  if (cmd->details[0]) fprintf(f, "\n%s", cmd->details);
  fprintf(f,
          "  --json        print the reply as JSON (also before the command)\n"
          "\nGlobal options and exit status: fusectl --help\n");
}

static void fm_ctl_help(FILE *f) {
  char sock[512];
  fm_diag d;
  if (fm_default_socket_path(sock, sizeof sock, 0, 0, &d) != FM_OK) snprintf(sock, sizeof sock, "?");
  fprintf(f,
          "usage: fusectl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n"
          "\n"
          "Talks to fusemld, the node-local fused-kernel compilation daemon.\n"
          "\n"
          "commands:\n");
  for (size_t i = 0; i < FM_CTL_N_CMDS; i++) {
    char left[64];
    snprintf(left, sizeof left, "%s %s", fm_ctl_cmds[i].name, fm_ctl_cmds[i].usage);
    fprintf(f, "  %-36s %s\n", left, fm_ctl_cmds[i].help);
  }
  fprintf(f,
          "\n"
          "options (before the command):\n"
          "  -s, --socket PATH   the daemon's socket (default: $FUSEML_SOCKET, else\n"
          "                      %s)\n"
          "  -j, --json          print replies as JSON; a failure as {\"error\": CODE, \"message\": ...}\n"
          "  -t, --timeout MS    per-request timeout (default %d for compile and warm,\n"
          "                      %d otherwise; 0 waits forever)\n"
          "  -h, --help          this help (COMMAND --help, or help COMMAND: that command's)\n"
          "  -V, --version       fusectl's version and protocol\n"
          "\n"
          "exit status:\n"
          "  0  ok\n"
          "  1  the daemon answered with an error (its code is printed)\n"
          "  2  usage error\n"
          "  3  cannot reach the daemon\n"
          "  4  bad input file\n",
          sock, FM_CTL_TIMEOUT_LONG, FM_CTL_TIMEOUT_SHORT);
}

/* The code --json gives a failure fusectl found itself, by its exit status. */
static const char *fm_ctl_exit_code_name(int exit_code) {
  switch (exit_code) {
    case FM_CTL_EXIT_USAGE:
      return "usage";
    case FM_CTL_EXIT_UNREACHABLE:
      return "unreachable";
    case FM_CTL_EXIT_INPUT:
      return "bad_input";
    default:
      return "failed";
  }
}

static int fm_ctl_verror(fm_ctl *ctl, int exit_code, const char *code, const char *fmt, va_list ap) {
  char text[sizeof ctl->err_text];
  vsnprintf(text, sizeof text, fmt, ap);
  fprintf(stderr, "fusectl: %s\n", text);
  if (ctl && !ctl->err_code[0]) {
    /* In JSON the code has its own field: not repeated at the start of the message. */
    size_t n = code ? strlen(code) : 0;
    const char *msg = n && strncmp(text, code, n) == 0 && strncmp(text + n, ": ", 2) == 0 ? text + n + 2 : text;
    snprintf(ctl->err_code, sizeof ctl->err_code, "%s", code ? code : fm_ctl_exit_code_name(exit_code));
    snprintf(ctl->err_text, sizeof ctl->err_text, "%s", msg);
  }
  return exit_code;
}

int fm_ctl_error(fm_ctl *ctl, int exit_code, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fm_ctl_verror(ctl, exit_code, code, fmt, ap);
  va_end(ap);
  return exit_code;
}

int fm_ctl_usage_error(fm_ctl *ctl, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fm_ctl_verror(ctl, FM_CTL_EXIT_USAGE, NULL, fmt, ap);
  va_end(ap);
  if (ctl && ctl->cmd)
    fprintf(stderr, "usage: fusectl [options] %s %s\n", ctl->cmd->name, ctl->cmd->usage);
  else
    fputs("usage: fusectl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS] (see --help)\n", stderr);
  return FM_CTL_EXIT_USAGE;
}

/* One line, not the usage: the option is what was wrong, and --help has the rest. */
int fm_ctl_bad_option(fm_ctl *ctl, int c, char **argv) {
  const char *name = ctl && ctl->cmd ? ctl->cmd->name : NULL;
  return fm_ctl_error(ctl, FM_CTL_EXIT_USAGE, NULL, "%s%s%s '%s'; see `fusectl %s%s--help`", name ? name : "",
                      name ? ": " : "", c == ':' ? "missing argument for" : "unknown option", argv[optind - 1],
                      name ? name : "", name ? " " : "");
}

void fm_ctl_print_reply(fm_ctl *ctl, const msgpack_object *reply, int inline_depth, const char *omit) {
  const char *const wire[] = {"ok", "id", omit, NULL};
  fm_ctl_print_json(stdout, reply, inline_depth, wire);
  ctl->json_done = 1;
}

void fm_ctl_print_packed(fm_ctl *ctl, msgpack_sbuffer *sb, int inline_depth) {
  msgpack_zone zone;
  msgpack_object obj;
  msgpack_zone_init(&zone, 4096);
  if (msgpack_unpack(sb->data, sb->size, NULL, &zone, &obj) == MSGPACK_UNPACK_SUCCESS)
    fm_ctl_print_reply(ctl, &obj, inline_depth, NULL);
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(sb);
}

/* --json after a failure: {"error": code, "message": text} on stdout. */
static void fm_ctl_print_error_json(fm_ctl *ctl, int exit_code) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  fm_pack_kv_cstr(&pk, "error", ctl->err_code[0] ? ctl->err_code : fm_ctl_exit_code_name(exit_code));
  fm_pack_kv_cstr(&pk, "message", ctl->err_text);
  fm_ctl_print_packed(ctl, &sb, 1);
}

static int fm_ctl_cmd_help(fm_ctl *ctl, int argc, char **argv) {
  const fm_ctl_cmd *cmd;
  if (argc > 2) return fm_ctl_usage_error(ctl, "help wants at most one COMMAND");
  if (argc == 1) {
    fm_ctl_help(stdout);
    return FM_CTL_EXIT_OK;
  }
  if (!(cmd = fm_ctl_find_cmd(argv[1])))
    return fm_ctl_usage_error(ctl, "unknown command '%s' (the commands: fusectl help)", argv[1]);
  fm_ctl_cmd_usage_help(stdout, cmd);
  return FM_CTL_EXIT_OK;
}

/* --help or -h among a command's arguments (before a "--"): its help, whatever else is there,
 * so that a half-written command line can still ask. */
static int fm_ctl_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
  return 0;
}

int fm_ctl_connect(fm_ctl *ctl) {
  fm_diag d = {{0}};
  int err;
  if (ctl->client) return FM_CTL_EXIT_OK;
  err = fm_client_connect(ctl->socket_path, "fusectl", ctl->timeout_ms, &ctl->client, &d);
  if (err == FM_OK) return FM_CTL_EXIT_OK;
  /* Every connect failure is "cannot reach": the daemon is absent, hung, one we cannot speak
   * to, one that refused us (permission_denied, busy: its code is printed), or a socket we
   * refused; the message names the socket so a wrong path is obvious. */
  int refused = err == FM_EDENIED || err == FM_EBUSY;
  const char *code = refused ? fm_err_slug(err) : NULL;
  if (strstr(d.text, ctl->socket_path))
    fm_ctl_error(ctl, FM_CTL_EXIT_UNREACHABLE, code, "%s%s%s", refused ? fm_err_slug(err) : "", refused ? ": " : "",
                 d.text);
  else
    fm_ctl_error(ctl, FM_CTL_EXIT_UNREACHABLE, code, "cannot reach fusemld at %s: %s", ctl->socket_path, d.text);
  if (err != FM_EPROTO_VERSION && !refused)
    fprintf(stderr,
            "fusectl: is fusemld running? Start it with `fusemld` (or `systemctl --user "
            "start fusemld.socket`), or point --socket or FUSEML_SOCKET at its socket.\n");
  return FM_CTL_EXIT_UNREACHABLE;
}

int fm_ctl_report(fm_ctl *ctl, const char *what, int err, const msgpack_object *reply, const fm_diag *d) {
  if (reply && reply->type == MSGPACK_OBJECT_MAP)
    return fm_ctl_error(ctl, FM_CTL_EXIT_DAEMON, fm_err_slug(err), "%s: %s", fm_err_slug(err), d->text);
  switch (err) {
    case FM_ECLOSED:
    case FM_ETIMEOUT:
    case FM_EIO:
    case FM_EPROTOCOL:
      return fm_ctl_error(ctl, FM_CTL_EXIT_UNREACHABLE, NULL, "%s: lost fusemld at %s: %s", what, ctl->socket_path,
                          d->text);
    default:
      /* Refused before sending (too large, not a map): the input is at fault. */
      return fm_ctl_error(ctl, FM_CTL_EXIT_INPUT, NULL, "%s: %s", what, d->text);
  }
}

int fm_ctl_call(fm_ctl *ctl, const char *op, uint32_t n_fields, fm_pack_fields_fn pack_fields, void *ctx,
                msgpack_zone *zone, msgpack_object *reply) {
  fm_diag d = {{0}};
  int rc = fm_ctl_connect(ctl), err;
  reply->type = MSGPACK_OBJECT_NIL;
  if (rc) return rc;
  err = fm_client_call(ctl->client, op, n_fields, pack_fields, ctx, zone, reply, &d);
  if (err == FM_OK) return FM_CTL_EXIT_OK;
  return fm_ctl_report(ctl, op, err, reply, &d);
}

static int fm_ctl_parse_timeout(const char *s, int *out) {
  char *end;
  long v;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < 0 || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"socket", required_argument, NULL, 's'},  {"json", no_argument, NULL, 'j'},
      {"timeout", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},       {NULL, 0, NULL, 0},
  };
  fm_ctl ctl = {0};
  char sock[512];
  int timeout = -1, c, rc;
  const char *name;

  opterr = 0;
  /* "+": stop at the command (its own options are parsed by its handler); ":" reports a
   * missing argument apart from an unknown option. */
  while ((c = getopt_long(argc, argv, "+:s:jt:hV", opts, NULL)) != -1) {
    switch (c) {
      case 's':
        ctl.socket_path = optarg;
        break;
      case 'j':
        ctl.json = 1;
        break;
      case 't':
        if (fm_ctl_parse_timeout(optarg, &timeout)) {
          rc = fm_ctl_usage_error(&ctl, "--timeout wants milliseconds (an integer >= 0), got '%s'", optarg);
          goto out;
        }
        break;
      case 'h':
        fm_ctl_help(stdout);
        return FM_CTL_EXIT_OK;
      case 'V':
        printf("fusectl %s (protocol %d)\n", FM_VERSION_STRING, FM_PROTO_VERSION);
        return FM_CTL_EXIT_OK;
      default:
        rc = fm_ctl_bad_option(&ctl, c, argv);
        goto out;
    }
  }
  if (optind >= argc) {
    rc = fm_ctl_usage_error(&ctl, "no command given");
    goto out;
  }
  name = argv[optind];
  if (!(ctl.cmd = fm_ctl_find_cmd(name))) {
    rc = fm_ctl_usage_error(&ctl, "unknown command '%s' (the commands: fusectl help)", name);
    goto out;
  }
  if (fm_ctl_wants_help(argc - optind, argv + optind)) {
    fm_ctl_cmd_usage_help(stdout, ctl.cmd);
    return FM_CTL_EXIT_OK;
  }
  if (ctl.cmd->flags & FM_CTL_LOCAL) {
    rc = ctl.cmd->handler(&ctl, argc - optind, argv + optind);
    goto out;
  }

  if (timeout < 0) timeout = ctl.cmd->flags & FM_CTL_LONG ? FM_CTL_TIMEOUT_LONG : FM_CTL_TIMEOUT_SHORT;
  ctl.timeout_ms = timeout;
  if (!ctl.socket_path) {
    fm_diag d = {{0}};
    if (fm_default_socket_path(sock, sizeof sock, 1, 0, &d) != FM_OK) {
      rc = fm_ctl_error(&ctl, FM_CTL_EXIT_UNREACHABLE, NULL, "cannot determine the default socket path: %s", d.text);
      goto out;
    }
    ctl.socket_path = sock;
  }

  rc = ctl.cmd->handler(&ctl, argc - optind, argv + optind);
  fm_client_close(ctl.client);
out:
  if (rc && ctl.json && !ctl.json_done) fm_ctl_print_error_json(&ctl, rc);
  return rc;
}
