"""Graph breaks that libraries people compile put in a model's forward, avoided where Dynamo
offers a way.

Hugging Face's `logger.warning_once` (transformers patches it onto logging.Logger) runs inside
forward passes: `PreTrainedModel.loss_function` warns on every call of a model whose class name
names no known loss (GPT2LMHeadModel among them). Dynamo cannot trace a logger's method, so
the graph breaks there: the loss becomes a graph of its own, the logits' gradient enters the
model's backward as a tangent (contiguous, whatever the loss's backward wrote) and GPT-2's
padded head copies it whole (412 MB) to read it at a stride its GEMMs take. Registered with
Dynamo's ignored logger methods, the call is skipped inside compiled code and the graph stays
whole. (Dynamo's reorderable logging functions would keep the message, but torch 2.11 does not
reorder a logger's method: the graph still broke there on an H200's torch.)

Registered when fuseml is imported (if transformers already patched them) and whenever a
FuseMLCompiler is made or the "fuseml" backend is called, so that a model compiled after it
has no such break. The registration is process-wide (Dynamo's config is), and so reaches every backend
compiled later in the process. What it costs: these once-per-process notices are not printed
from compiled code (an eager call still prints them)."""

import logging

import torch

# Logger methods libraries patch onto logging.Logger and call inside forward passes
# (transformers' utils/logging.py)
_PATCHED_LOGGER_METHODS = ("warning_once", "info_once")


def _ignored():
    """Dynamo's set of logger methods skipped in compiled code (its name by torch version), or
    None where this torch has none."""
    config = torch._dynamo.config
    for name in ("ignore_logging_functions", "ignore_logger_methods"):
        found = getattr(config, name, None)
        if isinstance(found, set):
            return found
    return None


def avoid():
    """Registers the patched logger methods that exist now with Dynamo (above); returns how
    many are registered."""
    ignored = _ignored()
    if ignored is None:
        return 0
    n = 0
    for name in _PATCHED_LOGGER_METHODS:
        method = getattr(logging.Logger, name, None)
        if not callable(method):
            continue
        if method not in ignored:
            ignored.add(method)
            if not _config_still_logs():
                ignored.discard(method)
                break
        n += 1
    return n


def _config_still_logs():
    """Whether Dynamo can still write its config into its compile metrics. torch 2.11 writes the
    set of ignored logging functions sorted (its blocklist names only the set's old alias), and
    two functions do not compare: each compile then logs an error with a traceback. There,
    only the first method (warning_once, the one that broke GPT-2's graph) is registered."""
    write = getattr(torch._dynamo.utils, "_get_dynamo_config_for_logging", None)
    if write is None:
        return True
    try:
        write()
    except TypeError:
        return False
    return True
