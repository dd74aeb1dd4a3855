"""Errors the engine raises for bad input: each says what is wrong and what to do about it."""


class DFlashError(Exception):
    """Base class: a problem a person can fix (wrong folder, mismatched draft, bad setting)."""


class ModelFolderError(DFlashError):
    """A model folder is missing, incomplete or not of the expected kind."""


class DraftMismatchError(DFlashError):
    """A draft does not fit the target (vocabulary, hidden size, layer ids, head file)."""


class DeviceError(DFlashError):
    """The requested device cannot run this configuration (e.g. DFlash on NPU)."""
