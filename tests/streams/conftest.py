"""TorchRL's collectors warn on import of deprecations inside TorchRL (its own weight
updaters); imported here once, quietly, so that a test shows only the warnings it asks for."""
import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Creating .* inherits from WeightUpdaterBase", DeprecationWarning)
    import torchrl.collectors  # noqa: F401
