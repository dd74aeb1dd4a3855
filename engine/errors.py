"""Errors the engine raises for bad input: each says what is wrong and what to do about it."""


class DFlashError(Exception):
    """Base class: a problem a person can fix (wrong folder, mismatched draft, bad setting)."""


class ModelFolderError(DFlashError):
    """A model folder is missing, incomplete or not of the expected kind."""


class DraftMismatchError(DFlashError):
    """A draft does not fit the target (vocabulary, hidden size, layer ids, head file)."""


class DeviceError(DFlashError):
    """The requested device cannot run this configuration (e.g. DFlash on NPU)."""


class ContextLengthError(DFlashError, ValueError):
    """A request does not fit the target's context (prompt + max_new_tokens) or its KV cache.

    Also a ValueError: callers that refuse bad settings by catching ValueError refuse this too."""


class OutputFolderError(DFlashError):
    """A folder the command must write to cannot be written (permissions, read-only disk, a file in the way)."""
