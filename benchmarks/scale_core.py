"""The real core of the collection-scale rehearsal (``scale``): a collection's passages encoded once, a chunk at a
time, each chunk saved as it completes, so that a killed encoding (an hour with mpnet on 2 cores) resumes at the
first missing chunk."""
import json
from pathlib import Path
from typing import List, Tuple

import numpy as np

from pyterrier_rdime.experiment.collection import load_collection
from pyterrier_rdime.experiment.encoders import load_encoder
from pyterrier_rdime.experiment.indexes import encoder_slug

#: Passages per saved chunk: ~2 min of mpnet on 2 quiet cores, the most a killed run loses.
CHUNK = 512


def core_vectors(collection: str, encoder: str, cache: Path, batch_size: int = 32,
                 verbose: bool = True) -> Tuple[List[str], np.ndarray]:
    """The docnos and float32 vectors of every passage of ``collection`` encoded with ``encoder``, cached under
    ``cache/core/<collection>/<encoder>/``: passages sorted by length (less padding per batch), encoded ``CHUNK`` at a
    time, each chunk written then renamed into place; the finished file ``vectors.npy`` is read back on later
    calls."""
    loaded = load_collection(collection)
    folder = Path(cache) / 'core' / loaded.slug / encoder_slug(encoder)
    done = folder / 'vectors.npy'
    if done.is_file():
        return json.loads((folder / 'docnos.json').read_text()), np.load(done)
    folder.mkdir(parents=True, exist_ok=True)
    docs = sorted(loaded.docs(None), key=lambda doc: len(doc['text']))
    model = None
    chunks = []
    from tqdm import tqdm
    with tqdm(total=len(docs), desc=f'encoding {loaded.name} with {Path(encoder).name}', unit='doc',
              disable=not verbose, smoothing=0.05) as progress:
        for start in range(0, len(docs), CHUNK):
            path = folder / f'chunk{start // CHUNK:05d}.npy'
            if not path.is_file():
                model = model or load_encoder(encoder, batch_size=batch_size)
                vectors = np.asarray(model.encode_docs([doc['text'] for doc in docs[start:start + CHUNK]]),
                                     dtype=np.float32)
                with open(path.with_suffix('.tmp'), 'wb') as f:
                    np.save(f, vectors)
                path.with_suffix('.tmp').replace(path)
            chunks.append(path)
            progress.update(min(CHUNK, len(docs) - start))
    vectors = np.concatenate([np.load(p) for p in chunks])
    docnos = [doc['docno'] for doc in docs]
    (folder / 'docnos.json').write_text(json.dumps(docnos))
    with open(folder / 'vectors.tmp', 'wb') as f:
        np.save(f, vectors)
    (folder / 'vectors.tmp').replace(done)
    for path in chunks:
        path.unlink()
    return docnos, vectors
