"""TORCH_NEURONX_LOG_LEVEL and TORCH_NEURONX_LOG_FILE: the verbosity and destination of the ``torch_neuronx``
logger (TorchNeuron's variables)."""

from __future__ import annotations

import logging
import os
import warnings

logger = logging.getLogger("torch_neuronx")

_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10,
           # TorchNeuron's numeric levels
           "0": logging.ERROR, "1": logging.WARNING, "2": logging.INFO, "3": logging.DEBUG}


def configure_from_env() -> None:
    """Apply TORCH_NEURONX_LOG_LEVEL (TRACE, DEBUG, INFO, WARNING, ERROR, FATAL, OFF, or TorchNeuron's 0-3:
    ERROR, WARNING, INFO, DEBUG); unset leaves logging alone.

    It runs on ``import torch`` (autoload): a bad value warns and is ignored,
    never failing every program in the environment.
    """
    text = os.environ.get("TORCH_NEURONX_LOG_LEVEL", "").strip().upper()
    path = os.environ.get("TORCH_NEURONX_LOG_FILE", "").strip()
    if text and text not in _LEVELS:
        warnings.warn(f"TORCH_NEURONX_LOG_LEVEL={text!r} is not a level, ignored: use one of {', '.join(_LEVELS)}",
                      stacklevel=2)
        text = ""
    if not text and not path:
        return
    if text:
        logger.setLevel(_LEVELS[text])
    if logger.handlers:
        return
    handler: logging.Handler = logging.StreamHandler()
    if path:
        try:  # append, as TorchNeuron does; opened on the first record, so import never writes
            handler = logging.FileHandler(os.path.expanduser(path), mode="a", delay=True)
        except OSError as exc:
            warnings.warn(f"TORCH_NEURONX_LOG_FILE={path!r} cannot be opened ({exc}); logging to stderr",
                          stacklevel=2)
    handler.setFormatter(logging.Formatter("[torch_neuronx %(levelname)s] %(message)s"))
    logger.addHandler(handler)
