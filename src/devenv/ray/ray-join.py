"""`ray start` for an extra worker node of a raypipe test head, on 127.0.0.1.

raypipe writes this file into a test head's directory and runs it with the head's Python as
`python ray-join.py start --address=127.0.0.1:<gcs port> --block …`. Plain `ray start` cannot
do that in Ray 2.60: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (what keeps a node on 127.0.0.1)
it refuses to join a cluster ("Multi-node Ray clusters are not supported on Windows and
OSX"), and with it 1 it swaps 127.0.0.1, in the node address and in the GCS address, for the
host's interface address. So, in this one process only, the multi-node switch is on and the
address Ray works out "from the network's perspective" is 127.0.0.1; the node's own
processes run with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 from the environment, like the head's.
"""

import sys

import ray._private.ray_constants as ray_constants
import ray._private.services as services

LOOPBACK = "127.0.0.1"

ray_constants.ENABLE_RAY_CLUSTER = True
services.node_ip_address_from_perspective = lambda address=None: LOOPBACK

from ray.scripts.scripts import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "ray"
    sys.exit(main())
