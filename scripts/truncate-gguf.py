#!/usr/bin/env python3
"""Copy a llama-family GGUF keeping only its first N transformer layers.

The copy has the original's tokenizer, embedding, output head and the first N blocks' weights
byte for byte, with `<arch>.block_count` set to N. It is a real model of real weight statistics,
small enough to travel where the whole file cannot (a GPU machine whose upload is limited):
the CUDA tests compare the GPU forward with the CPU forward on the same file, which needs no
particular depth.

    scripts/truncate-gguf.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol-6l.gguf --layers 6
"""
import argparse
import re
import sys

import gguf


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--layers", type=int, required=True, help="layers to keep (>= 1)")
    args = parser.parse_args()

    reader = gguf.GGUFReader(args.input)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    block_count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    total = reader.fields[block_count_key].contents()
    if not 1 <= args.layers <= total:
        print(f"--layers must be in [1, {total}]", file=sys.stderr)
        return 2

    writer = gguf.GGUFWriter(args.output, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = args.layers if field.name == block_count_key else field.contents()
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)

    block = re.compile(r"^blk\.(\d+)\.")
    kept = [t for t in reader.tensors
            if not (m := block.match(t.name)) or int(m.group(1)) < args.layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    print(f"{args.output}: {args.layers} of {total} layers, {len(kept)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
