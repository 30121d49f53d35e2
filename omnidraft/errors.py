"""Typed errors. Library code raises these; the CLI catches them once and prints one line."""


class OmnidraftError(Exception):
    """Base class: the message is shown to the user as-is, so it must say what is wrong and how to fix it."""


class ModelFolderError(OmnidraftError):
    """A model or export folder is missing, incomplete or damaged."""


class TokenizerError(OmnidraftError):
    """A tokenizer file is missing, malformed or of an unsupported kind."""


class CacheFileError(OmnidraftError):
    """An n-gram cache file is corrupted or belongs to another drafter/target pair."""


class ManifestError(OmnidraftError):
    """An export manifest is missing, malformed, or does not match its artifact or tokenizer."""


class InvalidArgument(OmnidraftError):
    """A user-supplied option or input is out of range."""


class ContextOverflow(OmnidraftError):
    """A prompt plus the requested generation does not fit the model's context or exported cache."""


class ExportError(OmnidraftError):
    """Lowering, quantization or the parity gate failed."""


class DataError(OmnidraftError):
    """A data set, stream or stream file is missing or malformed."""


class AdapterError(OmnidraftError):
    """A drafter adapter (LoRA delta) or adapted drafter is damaged or belongs to another drafter/target."""


class OutputError(OmnidraftError):
    """An output file or folder cannot be written: not a regular file, read-only, or the disk is full."""


class FleetError(OmnidraftError):
    """A fleet run (Flower simulation or deployment) could not start or stopped before its last round."""
