"""An append's manifest merge, with no thread handoff for the manifests it leaves as they are.

pyiceberg's merging append packs the parent's manifests into bins of the target size and hands
every bin to its thread pool, even a bin of one full manifest that it passes through untouched.
A log table gains a full manifest every ~850 files, so on a long history most bins are such
(13 at 10,000 files): each append waited on that many futures, a cost that grew with history
and brought no work. Here only the bins that are rewritten go to the pool (in parallel, as
before); the others are passed through in the caller. Which bins are merged, and how, is
pyiceberg's rule unchanged.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.table.update.snapshot import _ManifestMergeManager, _MergeAppendFiles
from pyiceberg.utils.bin_packing import ListPacker
from pyiceberg.utils.concurrent import ExecutorFactory


def merge_in_caller(producer: Any) -> None:
    """Make ``producer`` (a merging append) merge its manifests as :class:`_PassThroughInCaller` does."""
    if not isinstance(producer, _MergeAppendFiles):
        return

    def process(manifests: list[ManifestFile]) -> list[ManifestFile]:
        data = [m for m in manifests if m.content == ManifestContent.DATA]
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        merger = _PassThroughInCaller(
            target_size_bytes=producer._target_size_bytes,
            min_count_to_merge=producer._min_count_to_merge,
            merge_enabled=producer._merge_enabled,
            snapshot_producer=producer,
        )
        return merger.merge_manifests(data) + deletes

    producer._process_manifests = process


class _PassThroughInCaller(_ManifestMergeManager[Any]):
    def _merge_group(self, first_manifest: ManifestFile, spec_id: int, manifests: list[ManifestFile]) -> list[ManifestFile]:
        packer: ListPacker[ManifestFile] = ListPacker(target_weight=self._target_size_bytes, lookback=1, largest_bin_first=False)
        bins = packer.pack_end(manifests, lambda m: m.manifest_length)
        executor = ExecutorFactory.get_or_create()
        # pyiceberg's rule: a bin of one manifest stays; so does the bin of the new manifest
        # while it holds fewer than the minimum count to merge; any other bin is rewritten.
        merged = {
            i: executor.submit(self._create_manifest, spec_id, manifest_bin)
            for i, manifest_bin in enumerate(bins)
            if len(manifest_bin) > 1 and not (first_manifest in manifest_bin and len(manifest_bin) < self._min_count_to_merge)
        }
        out: list[ManifestFile] = []
        for i, manifest_bin in enumerate(bins):
            if i in merged:
                out.append(merged[i].result())
            else:
                out.extend(manifest_bin)
        return out
