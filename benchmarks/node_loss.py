#!/usr/bin/env python
"""What a lost node costs ShardedPrunedRetriever on a real ``ray start`` cluster on this machine (the shared
``tools/ray_local_cluster.sh``: a head and two nodes offering ``shard0`` and ``shard1``, 1 CPU each): two array shards
of 10,000 x 64 pinned there, one call that matches one index, then the raylet of shard 0's node killed with SIGKILL
and the next call timed from the kill:

- ``lost``: no node offering ``shard0`` joins: the call must raise, naming the shard and its node, about ``timeout``
  seconds after Ray stops answering for the node;
- ``replaced``: a node offering ``shard0`` is started 5 s after the kill: the call must return the same ranking as
  one index, from the new node.

Each scenario starts and stops its own cluster (by PID, in a temporary folder). Usage (from the repository root)::

    python benchmarks/run.py node_loss                 # both, timeout=20 s (~1.5 min)
    python benchmarks/run.py node_loss --port 6431 --timeout 30
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import ROOT, log  # before the package: it sets the environment (offline hub, temporary homes)

from pyterrier_rdime import PrunedRetriever, ShardedPrunedRetriever

TOOL = ROOT.parent / 'shared' / 'tools' / 'ray_local_cluster.sh'
#: The first of the four agent ports of the replacement node: past those of the tool's nodes (52400-52433).
REPLACEMENT_AGENT_PORTS = 52490


def scenario(name: str, port: int, timeout: float) -> None:
    import ray
    folder = Path(tempfile.mkdtemp(prefix='bench-rdime-node-loss-'))
    env = {**os.environ, 'PORT': str(port), 'RAY': str(Path(sys.executable).with_name('ray')),
           'RAY_AUTH_MODE': os.environ.get('RAY_AUTH_MODE', 'disabled')}
    subprocess.run([str(TOOL), 'start', str(folder), '2'], env=env, check=True, capture_output=True)
    try:
        rng = np.random.default_rng(0)
        docs = rng.standard_normal((20000, 64)).astype(np.float32)
        queries = pd.DataFrame({'qid': ['1', '2'], 'query_vec': list(rng.standard_normal((2, 64)).astype('f4'))})
        expected = PrunedRetriever(index=docs, num_results=10, strategy='pruned')(queries)[['docno', 'score']]
        retriever = ShardedPrunedRetriever(shards=[docs[:10000], docs[10000:]], num_results=10, strategy='pruned',
                                           timeout=timeout, ray_address=f'127.0.0.1:{port}',
                                           resources=[{'shard0': 0.1}, {'shard1': 0.1}])
        assert retriever(queries)[['docno', 'score']].equals(expected)
        subprocess.run([str(TOOL), 'kill', str(folder), 'n0'], env=env, check=True, capture_output=True)
        killed = time.monotonic()
        if name == 'replaced':
            time.sleep(5)
            agent = REPLACEMENT_AGENT_PORTS
            subprocess.run([env['RAY'], 'start', f'--address=127.0.0.1:{port}', '--num-cpus=1',
                            '--resources={"shard0": 1}', f'--temp-dir={folder}/t/n9',
                            f'--object-store-memory={300 * 2 ** 20}', f'--dashboard-agent-listen-port={agent}',
                            f'--dashboard-agent-grpc-port={agent + 1}', f'--runtime-env-agent-port={agent + 2}',
                            f'--metrics-export-port={agent + 3}'], env=env, check=True, capture_output=True)
            log(f'{name}: a node offering shard0 started {time.monotonic() - killed:.1f} s after the kill')
        try:
            same = retriever(queries)[['docno', 'score']].equals(expected)
            log(f'{name}: the call returned {"the same" if same else "ANOTHER"} ranking as one index '
                f'{time.monotonic() - killed:.1f} s after the kill (timeout={timeout:g} s)')
        except RuntimeError as e:
            log(f'{name}: the call raised {time.monotonic() - killed:.1f} s after the kill (timeout={timeout:g} s): '
                f'{e}')
        retriever.close()
    finally:
        ray.shutdown()
        subprocess.run([str(TOOL), 'stop', str(folder)], env=env, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--port', type=int, default=6431, help="the head's port (the tool's agents use 524xx)")
    parser.add_argument('--timeout', type=float, default=20)
    args = parser.parse_args(argv)
    log(f'# node_loss: load average {os.getloadavg()[0]:.2f} (2 cores shared)')
    for name in ('lost', 'replaced'):
        scenario(name, args.port, args.timeout)
    return 0


if __name__ == '__main__':
    sys.exit(main())
