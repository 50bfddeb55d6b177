/* fuzz_replay.c: runs a libFuzzer harness over files without libFuzzer, so any compiler (and
 * ctest) can replay the seed corpus and the regression vectors: every argument is a file or a
 * directory of files, each passed once to LLVMFuzzerTestOneInput. A crash is the failure. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path, unsigned *n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
    return 1;
  }
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0, got;
  uint8_t chunk[65536];
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (len + got > cap) {
      cap = (len + got) * 2;
      uint8_t *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return 1;
      }
      buf = nb;
    }
    memcpy(buf + len, chunk, got);
    len += got;
  }
  fclose(f);
  /* An exact-size copy, so ASan sees reads one past the end of the input. */
  uint8_t *exact = malloc(len ? len : 1);
  if (!exact) {
    free(buf);
    return 1;
  }
  if (len) memcpy(exact, buf, len);
  free(buf);
  LLVMFuzzerTestOneInput(exact, len);
  free(exact);
  (*n)++;
  return 0;
}

int main(int argc, char **argv) {
  unsigned n = 0, failed = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "fuzz_replay: no such file %s\n", argv[i]);
      failed++;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      failed += (unsigned)run_file(argv[i], &n);
      continue;
    }
    DIR *dir = opendir(argv[i]);
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) failed += (unsigned)run_file(path, &n);
    }
    if (dir) closedir(dir);
  }
  printf("%u passed, %u failed\n", n, failed);
  return failed ? 1 : 0;
}
