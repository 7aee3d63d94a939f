#!/usr/bin/python3
"""Megatron-Core's indexed datasets and GPT sample order, transcribed for dtrain's tests from Megatron-LM
(megatron/core/datasets/indexed_dataset.py: _INDEX_HEADER, DType, _IndexWriter, _IndexReader, IndexedDatasetBuilder;
gpt_dataset.py: _get_num_epochs, _build_document_index, _build_shuffle_index, _query_document_sample_shuffle_indices;
helpers.cpp: build_sample_idx, build_blending_indices; blended_megatron_dataset_builder.py:
_get_size_per_split_per_dataset), with numpy as Megatron uses it (numpy.random.RandomState, numpy.memmap). Only the
parts a GPT dataset of one sequence per document needs; no torch.

Usage (JSON on stdout):
  megatron_indexed.py write PREFIX DTYPE < documents.json      [[ids...], ...] -> PREFIX.bin/.idx
  megatron_indexed.py read PREFIX                               {"dtype": ..., "documents": [[ids...], ...]}
  megatron_indexed.py samples SEQ_LEN SAMPLES SEED W1 P1 [W2 P2 ...]   the blend's first SAMPLES samples:
                                                                [{"dataset": i, "tokens": [...]}, ...]
"""
import json
import math
import struct
import sys

import numpy

_INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64, 6: numpy.float64,
          7: numpy.float32, 8: numpy.uint16}
CODES = {v.__name__: k for k, v in DTYPES.items()}


def write(prefix, dtype_name, documents):
    dtype = getattr(numpy, dtype_name)
    sequence_lengths = []
    document_indices = [0]
    with open(prefix + ".bin", "wb") as data_file:
        for doc in documents:  # IndexedDatasetBuilder.add_document with one sequence
            np_array = numpy.array(doc, dtype=dtype)
            data_file.write(np_array.tobytes(order="C"))
            sequence_lengths.append(len(doc))
            document_indices.append(len(sequence_lengths))
    itemsize = numpy.int64(numpy.dtype(dtype).itemsize)
    pointers, curr = [], numpy.int64(0)
    for length in sequence_lengths:
        pointers.append(curr.item())
        curr += length * itemsize
    with open(prefix + ".idx", "wb") as idx:  # _IndexWriter
        idx.write(_INDEX_HEADER)
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", CODES[dtype_name]))
        idx.write(struct.pack("<Q", len(sequence_lengths)))
        idx.write(struct.pack("<Q", len(document_indices)))
        idx.write(numpy.array(sequence_lengths, dtype=numpy.int32).tobytes(order="C"))
        idx.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
        idx.write(numpy.array(document_indices, dtype=numpy.int64).tobytes(order="C"))


class Indexed:
    """_IndexReader and IndexedDataset.get over numpy.memmap."""

    def __init__(self, prefix):
        with open(prefix + ".idx", "rb") as stream:
            assert stream.read(9) == _INDEX_HEADER, f"bad header, cannot read: {prefix}.idx"
            assert struct.unpack("<Q", stream.read(8))[0] == 1
            self.dtype = DTYPES[struct.unpack("<B", stream.read(1))[0]]
            self.sequence_count = struct.unpack("<Q", stream.read(8))[0]
            self.document_count = struct.unpack("<Q", stream.read(8))[0]
            offset = stream.tell()
        buf = memoryview(numpy.memmap(prefix + ".idx", mode="r", order="C"))
        self.sequence_lengths = numpy.frombuffer(buf, dtype=numpy.int32, count=self.sequence_count, offset=offset)
        self.sequence_pointers = numpy.frombuffer(buf, dtype=numpy.int64, count=self.sequence_count,
                                                  offset=offset + self.sequence_lengths.nbytes)
        self.document_indices = numpy.frombuffer(
            buf, dtype=numpy.int64, count=self.document_count,
            offset=offset + self.sequence_lengths.nbytes + self.sequence_pointers.nbytes)
        self.bin = memoryview(numpy.memmap(prefix + ".bin", mode="r", order="C"))

    def get(self, idx, offset=0, length=None):
        if length is None:
            length = self.sequence_lengths[idx] - offset
        ptr = self.sequence_pointers[idx] + offset * numpy.dtype(self.dtype).itemsize
        return numpy.frombuffer(self.bin, dtype=self.dtype, count=length, offset=ptr)


def build_sample_idx(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch):
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = numpy.zeros((num_samples + 1, 2), dtype=numpy.int64)
    document_idx_index, doc_offset, sample_idx_index = 0, 0, 1
    while sample_idx_index <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            document_length = sizes[document_idx[document_idx_index]] - doc_offset
            remaining -= document_length
            if remaining <= 0:
                doc_offset += remaining + document_length - 1
                remaining = 0
            else:
                if document_idx_index == len(document_idx) - 1:
                    doc_offset = sizes[document_idx[document_idx_index]] - 1
                    break
                document_idx_index += 1
                doc_offset = 0
        sample_idx[sample_idx_index] = (document_idx_index, doc_offset)
        sample_idx_index += 1
    return sample_idx


def build_document_index(documents, num_epochs, rs, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        document_index = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        document_index[:] = documents
        document_index = document_index.reshape(-1).astype(numpy.int32)
        rs.shuffle(document_index)
        return document_index
    first = build_document_index(documents, num_epochs - 1, rs, False)
    last = build_document_index(documents, 1, rs, False)
    return numpy.concatenate((first, last))


def build_shuffle_index(num_samples, total_size, rs):
    first = numpy.arange(start=0, stop=num_samples, step=1, dtype=numpy.uint32)
    rs.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(start=num_samples, stop=total_size, step=1, dtype=numpy.uint32)
    rs.shuffle(last)
    return numpy.concatenate((first, last))


class GPTDataset:
    def __init__(self, indexed, num_samples, seq_length, seed):
        self.indexed = indexed
        indices = numpy.arange(0, indexed.sequence_count, dtype=numpy.int32)
        tokens_per_epoch = int(numpy.sum(indexed.sequence_lengths[indices]))
        num_epochs, num_tokens = 1, tokens_per_epoch
        while num_tokens < num_samples * seq_length + 1:
            num_epochs += 1
            num_tokens += tokens_per_epoch
        separate = False
        if num_epochs > 1:
            sans_final = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
            from_final = num_samples - sans_final
            per_epoch = (tokens_per_epoch - 1) // seq_length
            separate = from_final < int(0.80 * per_epoch)
        rs = numpy.random.RandomState(seed)
        self.document_index = build_document_index(indices, num_epochs, rs, separate)
        self.sample_index = build_sample_idx(indexed.sequence_lengths, self.document_index, seq_length, num_epochs,
                                             tokens_per_epoch)
        total = self.sample_index.shape[0] - 1
        self.shuffle_index = build_shuffle_index(sans_final if separate else total, total, rs)

    def __getitem__(self, idx):
        idx = self.shuffle_index[idx]
        beg, beg_off = self.sample_index[idx]
        end, end_off = self.sample_index[idx + 1]
        if beg == end:
            parts = [self.indexed.get(self.document_index[beg], offset=int(beg_off), length=end_off - beg_off + 1)]
        else:
            parts = []
            for i in range(beg, end + 1):
                offset = 0 if i > beg else beg_off
                length = None if i < end else end_off + 1
                parts.append(self.indexed.get(self.document_index[i], offset=int(offset), length=length))
        return numpy.concatenate(parts)


def build_blending_indices(weights, size):
    dataset_index, dataset_sample_index = [], []
    current = [0] * len(weights)
    for sample_idx in range(size):
        at = max(float(sample_idx), 1.0)
        errors = [w * at - c for w, c in zip(weights, current)]
        best = max(range(len(weights)), key=lambda d: (errors[d], -d))
        dataset_index.append(best)
        dataset_sample_index.append(current[best])
        current[best] += 1
    return dataset_index, dataset_sample_index


def main():
    cmd = sys.argv[1]
    if cmd == "write":
        write(sys.argv[2], sys.argv[3], json.load(sys.stdin))
    elif cmd == "read":
        d = Indexed(sys.argv[2])
        docs = [d.get(i).tolist() for i in range(d.sequence_count)]
        print(json.dumps({"dtype": d.dtype.__name__, "documents": docs}))
    elif cmd == "samples":
        seq_len, samples, seed = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        words = sys.argv[5:]
        weights = [float(w) for w in words[0::2]]
        weights = (numpy.array(weights, dtype=numpy.float64) / numpy.sum(weights)).tolist()
        prefixes = words[1::2]
        if len(prefixes) == 1:
            ds = GPTDataset(Indexed(prefixes[0]), samples, seq_len, seed)
            out = [{"dataset": 0, "tokens": ds[i].tolist()} for i in range(samples)]
        else:
            target = [int(math.ceil(samples * w)) for w in weights]
            build = [int(math.ceil(math.ceil(samples * w) * 1.005)) for w in weights]
            datasets = [GPTDataset(Indexed(p), n, seq_len, seed) for p, n in zip(prefixes, build)]
            di, dsi = build_blending_indices(weights, sum(target))
            out = [{"dataset": di[i], "tokens": datasets[di[i]][dsi[i]].tolist()} for i in range(samples)]
        print(json.dumps(out))


if __name__ == "__main__":
    main()
