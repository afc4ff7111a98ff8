"""What opening a device or building a model on it can refuse."""


class DeviceError(RuntimeError):
    """No device fits the request; the message names what was found."""


class GpuUnsupported(DeviceError):
    """The GPU path has no kernel for something the model needs; `--device auto` runs it on the CPU."""
