"""The one exception type mlxnet raises for bad input or setup: its message is one clear line."""


class MlxnetError(Exception):
    """A user-facing error; the CLI prints its message alone, without a traceback."""
