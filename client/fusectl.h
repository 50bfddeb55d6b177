/* fusectl.h: private to fusectl (not installed): what its files share.
 *
 *   fusectl.c          main: global options, the command table, connecting, exit codes
 *   fusectl_cmds.c     ping, stats, ls, show, evict, shutdown
 *   fusectl_compile.c  compile; reading a fragment file
 *   fusectl_warm.c     warm: a manifest's fragments, several in flight
 *   fusectl_json.c     JSON file -> msgpack (the fragment JSON form is the wire form)
 *   fusectl_print.c    msgpack -> JSON, aligned tables, human sizes and ages
 *   fusectl_remote.c   export, import (portable snapshots, docs/REMOTE.md)
 */
#ifndef FUSECTL_H
#define FUSECTL_H

#include <stdio.h>
#include <msgpack.h>

#include "fm_client.h"

/* Exit codes (documented in `fusectl --help`). */
enum {
  FM_CTL_EXIT_OK = 0,
  FM_CTL_EXIT_DAEMON = 1,      /* the daemon answered with an error */
  FM_CTL_EXIT_USAGE = 2,       /* bad command line */
  FM_CTL_EXIT_UNREACHABLE = 3, /* cannot reach (or lost) the daemon */
  FM_CTL_EXIT_INPUT = 4,       /* bad input file */
};

typedef struct fm_ctl {
  const char *socket_path;
  int json;       /* --json */
  int json_done;  /* the command printed its JSON (a failure prints none then) */
  int timeout_ms; /* 0: wait forever */
  const struct fm_ctl_cmd *cmd;
  fm_client *client;
  char err_code[32]; /* the run's first failure, for --json ("" when none) */
  char err_text[sizeof(fm_diag) + 256];
} fm_ctl;

typedef int (*fm_ctl_handler)(fm_ctl *ctl, int argc, char **argv);

#define FM_CTL_PATH_TEXT 4200 /* a path as text, escaped (the daemon's paths: 4096) */

#define FM_CTL_LONG 0x1 /* compiles: the long default timeout */

#define FM_CTL_LOCAL 0x2 /* never talks to the daemon (help) */

typedef struct fm_ctl_cmd {
  const char *name;
  fm_ctl_handler handler;
  const char *usage; /* arguments after the name */
  const char *help;  /* one line */
  int flags;
  const char *details; /* `fusectl help CMD`: its options and what it prints */
} fm_ctl_cmd;

/* fusectl.c: connect (once) and call; on failure each prints the error and returns the
 * exit code to use, else 0. *reply lives in zone (caller inits/destroys). */
int fm_ctl_connect(fm_ctl *ctl);
int fm_ctl_call(fm_ctl *ctl, const char *op, uint32_t n_fields, fm_pack_fields_fn pack_fields, void *ctx,
                msgpack_zone *zone, msgpack_object *reply);
/* Prints a failed call's error; returns the exit code (1 if the daemon answered, else 3). */
int fm_ctl_report(fm_ctl *ctl, const char *what, int err, const msgpack_object *reply, const fm_diag *d);
/* Every failure goes through here: "fusectl: <message>" on stderr; the run's first failure is
 * kept, and with --json main prints it on stdout as {"error": code, "message": ...} unless the
 * command printed its own JSON. code NULL: named after exit_code (usage, unreachable,
 * bad_input). Returns exit_code. */
int fm_ctl_error(fm_ctl *ctl, int exit_code, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A usage error (fm_ctl_error), then "usage: fusectl [options] <cmd> <usage>" on stderr;
 * returns FM_CTL_EXIT_USAGE. */
int fm_ctl_usage_error(fm_ctl *ctl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* For a command's getopt_long loop: reports getopt's ':' or '?' as a one-line usage error that
 * names the option and points at the command's --help. */
int fm_ctl_bad_option(fm_ctl *ctl, int c, char **argv);

/* --json: prints a reply without its wire fields (ok, id) nor omit (may be NULL), as
 * fm_ctl_print_json, and notes that the command printed its JSON. */
void fm_ctl_print_reply(fm_ctl *ctl, const msgpack_object *reply, int inline_depth, const char *omit);
/* --json output fusectl builds itself: sb holds one packed value, printed as above; sb is
 * destroyed. Built as msgpack so that the one JSON writer does all the escaping. */
void fm_ctl_print_packed(fm_ctl *ctl, msgpack_sbuffer *sb, int inline_depth);

/* Command handlers: argv[0] is the command name; each parses its own options (with
 * optind = 0 to restart getopt), accepting --json there too. */
int fm_ctl_cmd_ping(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_stats(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_ls(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_show(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_evict(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_shutdown(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_compile(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_warm(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_export(fm_ctl *ctl, int argc, char **argv);
int fm_ctl_cmd_import(fm_ctl *ctl, int argc, char **argv);

/* ---- fusectl_compile.c ---- */
typedef struct fm_ctl_compile_req {
  const char *fragment; /* msgpack map */
  size_t len;
  const char *arch; /* NULL: the daemon's own */
} fm_ctl_compile_req;

/* fm_pack_fields_fn of a compile request (ctx: an fm_ctl_compile_req); 1 field, 2 with arch. */
void fm_ctl_pack_compile(msgpack_packer *pk, void *ctx);
/* Reads a fragment file into sb (msgpack). FM_EIO/FM_ELIMIT/FM_EMALFORMED from the reader,
 * FM_ESCHEMA when the document is not an object. */
int fm_ctl_load_fragment(const char *path, msgpack_sbuffer *sb, fm_diag *d);

/* ---- fusectl_json.c ---- */
#define FM_CTL_JSON_MAX_DEPTH 16 /* the top-level value is depth 1 */
#define FM_CTL_JSON_MAX_FILE  (1u << 20)

/* Converts a JSON document to msgpack, appended to out: objects -> maps (key order kept),
 * arrays -> arrays, integers -> ints, reals -> float64, strings -> str, true/false/null.
 * name labels errors ("frag.json:3:14: ..."). FM_EMALFORMED (not JSON, duplicate key),
 * FM_ELIMIT (deeper than FM_CTL_JSON_MAX_DEPTH), FM_ENOMEM. */
int fm_ctl_json_to_msgpack(const char *text, size_t len, const char *name, msgpack_sbuffer *out, fm_diag *d);
/* Reads path (at most FM_CTL_JSON_MAX_FILE bytes, else FM_ELIMIT; unreadable: FM_EIO) and
 * converts it as above. */
int fm_ctl_json_file_to_msgpack(const char *path, msgpack_sbuffer *out, fm_diag *d);

/* ---- fusectl_print.c ---- */
/* Writes o as JSON. Containers nested at depth >= inline_depth (the top level is 0) go on
 * one line; shallower ones are indented by 2. Bins become {"bin_bytes": N}; a top-level map
 * key in omit (a NULL-terminated list; omit itself may be NULL) is left out; non-string map
 * keys are written as strings; NaN/Inf as null; invalid UTF-8 bytes as U+FFFD; control
 * characters (C0, DEL, C1) as \u00XX. Ends with a newline. */
void fm_ctl_print_json(FILE *f, const msgpack_object *o, int inline_depth, const char *const *omit);

/* A table of rows of cells, printed with each column padded to its widest cell. */
typedef struct fm_ctl_table {
  size_t ncols, nrows, cap;
  char **cells;         /* nrows * ncols, malloc'd strings */
  unsigned right_align; /* bit i: column i is right-aligned (numbers) */
  int oom;              /* sticky: checked once at print time */
} fm_ctl_table;

void fm_ctl_table_init(fm_ctl_table *t, size_t ncols, unsigned right_align);
/* Adds a row from ncols C strings. */
void fm_ctl_table_row(fm_ctl_table *t, const char *const *cells);
/* Prints and frees; FM_ENOMEM if a row could not be stored. */
int fm_ctl_table_print(fm_ctl_table *t, FILE *f);

/* Human formats. */
void fm_ctl_fmt_bytes(uint64_t n, char *out, size_t cap);              /* "12.3 KiB" */
void fm_ctl_fmt_age(int64_t then, int64_t now, char *out, size_t cap); /* "5m ago" */
/* A scalar as text (str, ints, floats, bool, nil; containers as compact JSON). A string is
 * escaped for the terminal (fm_text.h): every human printer shows the daemon's strings this
 * way, so a control character stored in an entry never reaches the terminal as it is. */
void fm_ctl_fmt_scalar(const msgpack_object *o, char *out, size_t cap);

#endif
