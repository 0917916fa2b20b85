"""What the machine has: the GPU and its free memory (device.py), system RAM and what this process may
use of it (hostmem.py), host<->device copy speed (bandwidth.py), measured step speed (throughput.py) and
byte sizes as people write them (bytesize.py). Probes only: nothing here touches CUDA at import time."""
