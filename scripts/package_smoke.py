"""Smoke test of an installed pyterrier-rdime (run by package_smoke.sh inside a fresh venv, from outside the
checkout): the core install imports without torch, numba or scipy, ships its pt_docs pages, and a stage pipeline on
toy vectors gives the hand-computed kept sets and scores."""
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

import pyterrier_rdime
from pyterrier_rdime import PrfDime, Rdime, VectorScorer

here = Path(pyterrier_rdime.__file__).resolve()
assert 'site-packages' in here.parts, f'imported {here}, not the installed package: run from outside the checkout'
heavy = sorted({'torch', 'numba', 'scipy', 'transformers'} & set(sys.modules))
assert not heavy, f'import pyterrier_rdime loaded {heavy}: a core install must not need them'
pages = sorted(p.name for p in resources.files('pyterrier_rdime').joinpath('pt_docs').iterdir())
assert 'index.rst' in pages and 'api.rst' in pages, f'pt_docs missing from the installed package: {pages}'

f32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
d1, d2, d3 = f32(1.0, 0.4, -0.2, 0.1), f32(0.8, 0.6, 0.0, -0.1), f32(0.0, 0.1, 1.0, 1.0)
q1, q2 = f32(1.0, 0.5, 0.2, -0.1), f32(0.0, 0.0, 1.0, 0.0)
frame = pd.DataFrame({
    'qid': ['1', '1', '1', '2', '2'],
    'query': ['a', 'a', 'a', 'b', 'b'],
    'query_vec': [q1, q1, q1, q2, q2],
    'docno': ['d1', 'd2', 'd3', 'd3', 'd1'],
    'doc_vec': [d1, d2, d3, d3, d1],
    'score': [3.0, 2.0, 1.0, 2.0, 1.0],
    'rank': [0, 1, 2, 0, 1],
})
out = (PrfDime(num_docs=2) >> Rdime() >> VectorScorer())(frame)

# q1: u = q1 * mean(d1, d2) = [0.9, 0.25, -0.02, 0]; eps2 = mean(q1^2 - u) = 0.17 / 4; kept: dims 0 and 1
# q2: u = q2 * mean(d3, d1) = [0, 0, 0.4, 0]; eps2 = 0.6 / 4; kept: dim 2
per_query = out.groupby('qid').first()
assert per_query['query_kept'].tolist() == [2, 1], per_query['query_kept']
np.testing.assert_allclose(per_query['query_eps2'], [0.0425, 0.15], rtol=1e-5)
np.testing.assert_allclose(np.stack(per_query['query_vec']), [[1.0, 0.5, 0, 0], [0, 0, 1.0, 0]], atol=1e-7)
scores = out.set_index(['qid', 'docno'])['score']
expected = {('1', 'd1'): 1.2, ('1', 'd2'): 1.1, ('1', 'd3'): 0.05, ('2', 'd3'): 1.0, ('2', 'd1'): -0.2}
for key, value in expected.items():
    assert abs(scores[key] - value) < 1e-6, (key, scores[key], value)
assert out.sort_values(['qid', 'rank'])['docno'].tolist() == ['d1', 'd2', 'd3', 'd3', 'd1']
print(f'smoke test passed: pyterrier-rdime {pyterrier_rdime.__version__} from {here.parent}')
