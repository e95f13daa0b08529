"""TORCH_NEURONX_LOG_LEVEL: the verbosity of the ``torch_neuronx`` logger."""

from __future__ import annotations

import logging
import os
import warnings

logger = logging.getLogger("torch_neuronx")

_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}


def configure_from_env() -> None:
    """Apply TORCH_NEURONX_LOG_LEVEL (TRACE, DEBUG, INFO, WARNING, ERROR, FATAL, OFF); unset leaves logging alone.

    It runs on ``import torch`` (autoload): a bad value warns and is ignored,
    never failing every program in the environment.
    """
    text = os.environ.get("TORCH_NEURONX_LOG_LEVEL", "").strip().upper()
    if not text:
        return
    if text not in _LEVELS:
        warnings.warn(f"TORCH_NEURONX_LOG_LEVEL={text!r} is not a level, ignored: use one of {', '.join(_LEVELS)}",
                      stacklevel=2)
        return
    logger.setLevel(_LEVELS[text])
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[torch_neuronx %(levelname)s] %(message)s"))
        logger.addHandler(handler)
