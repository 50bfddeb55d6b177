/* fm_device.c: GPU or compile-only mode, and the fingerprint inputs. */
#include "fm_device.h"

#include <stdio.h>
#include <string.h>

/* cuBLASLt's header has a K&R-style declaration that our warning flags reject. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "fm_codegen.h"
#include "fm_cuda.h"
#include "fm_fragment.h"
#include "fm_nvrtc.h"

int fm_device_init(fm_devinfo *dev, const char *arch, fm_diag *d) {
  memset(dev, 0, sizeof *dev);
  int err = fm_nvrtc_version(&dev->nvrtc_major, &dev->nvrtc_minor);
  if (err) return fm_diag_set(d, err, "cannot query the NVRTC version: %s", fm_strerror(err));
  dev->cublaslt_version = (uint64_t)cublasLtGetVersion();

  const fm_cuda *cu = NULL;
  fm_diag why = {{0}};
  if (fm_cuda_load(&cu, &why) == FM_OK && fm_cuda_device_id(0, &dev->id, &why) == FM_OK) {
    if (!fm_nvrtc_arch_supported(dev->id.arch))
      return fm_diag_set(d, FM_EUNSUPPORTED, "GPU 0 (%s) needs %s, which this NVRTC %u.%u cannot target", dev->id.name,
                         dev->id.arch, dev->nvrtc_major, dev->nvrtc_minor);
    dev->gpu = 1;
  } else {
    snprintf(dev->why_no_gpu, sizeof dev->why_no_gpu, "%s", why.text[0] ? why.text : "no usable GPU");
    memset(&dev->id, 0, sizeof dev->id);
    snprintf(dev->id.name, sizeof dev->id.name, "none");
    if (!arch || !fm_nvrtc_arch_supported(arch))
      return fm_diag_set(d, FM_EUNSUPPORTED, "--arch %s is not an architecture this NVRTC %u.%u can target",
                         arch ? arch : "(none)", dev->nvrtc_major, dev->nvrtc_minor);
    snprintf(dev->id.arch, sizeof dev->id.arch, "%s", arch);
  }
  fm_device_label(&dev->id, dev->label, sizeof dev->label);
  return FM_OK;
}

int fm_device_for_arch(const fm_devinfo *dev, const char *arch, fm_device_id *out, fm_diag *d) {
  *out = dev->id;
  if (!arch || !*arch || strcmp(arch, dev->id.arch) == 0) return FM_OK;
  if (strlen(arch) >= sizeof out->arch || !fm_nvrtc_arch_supported(arch))
    return fm_diag_set(d, FM_EUNSUPPORTED, "arch \"%.32s\" is not one this daemon's NVRTC can target", arch);
  snprintf(out->arch, sizeof out->arch, "%s", arch);
  return FM_OK;
}

int fm_device_key(const fm_devinfo *dev, const fm_device_id *id, const uint8_t *canonical, size_t canonical_len,
                  fm_key *out) {
  char opts[512];
  fm_key_inputs in = {
      .canonical = canonical,
      .canonical_len = canonical_len,
      .device = id,
      .codegen_version = FM_CODEGEN_VERSION,
      .nvrtc_major = dev->nvrtc_major,
      .nvrtc_minor = dev->nvrtc_minor,
      .nvrtc_options = fm_nvrtc_options(id->arch, opts, sizeof opts),
      .vocab_version = FM_VOCAB_KEY,
      .cublaslt_version = dev->cublaslt_version,
  };
  if (!in.nvrtc_options) return FM_EINVAL;
  return fm_fingerprint(&in, out);
}

const char *fm_device_mode(const fm_devinfo *dev) { return dev->gpu ? "gpu" : "compile-only"; }
