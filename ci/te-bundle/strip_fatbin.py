"""Keep the GPU code of some architectures only, in a CUDA library: each ``.nv_fatbin`` entry
compiled for another SM architecture has its payload zeroed in place -- the headers stay, so the
driver still walks every entry and loads the one for its GPU -- and the library then compresses
to a fraction (TransformerEngine's: ~32 MB gzipped with sm_90 alone).

    python3 strip_fatbin.py LIB.so ARCHS      # ARCHS: SM numbers, comma-separated: 90 or 90,100

The layout read here (64-bit little-endian ELF; a fatbin: magic, version, header size, body
size; each entry in its body: kind, version, header size, payload size, ..., SM arch at byte 28
of its header) is what ``cuobjdump`` lists; nothing else in the file changes.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, body size
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, header size, payload size
ENTRY_ARCH_AT = 28


def sections(elf) -> list[tuple[str, int, int]]:
    """(name, file offset, size) of every section of a 64-bit little-endian ELF image."""
    if bytes(elf[:4]) != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    table = struct.unpack_from("<Q", elf, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    # each section header: name offset, type, flags, address, file offset, size, ...
    heads = [struct.unpack_from("<IIQQQQ", elf, table + i * entry_size) for i in range(count)]
    names = heads[names_index][4]
    out = []
    for name_at, _, _, _, offset, size in heads:
        start = names + name_at
        out.append((bytes(elf[start:elf.index(b"\0", start)]).decode(), offset, size))
    return out


def strip(elf: bytearray, keep: set[int]) -> tuple[int, int]:
    """Zero the payloads of the entries for architectures not in ``keep``, in place; (bytes
    kept, bytes zeroed)."""
    kept = zeroed = 0
    for name, offset, size in sections(elf):
        if name != ".nv_fatbin":
            continue
        pos, end = offset, offset + size
        while pos + FATBIN_HEADER.size <= end:
            magic, _, header, body = FATBIN_HEADER.unpack_from(elf, pos)
            if magic != FATBIN_MAGIC:  # padding between two fatbins
                pos += 8
                continue
            entry, stop = pos + header, pos + header + body
            while entry < stop:
                _, _, entry_header, payload = ENTRY_HEADER.unpack_from(elf, entry)
                arch = struct.unpack_from("<I", elf, entry + ENTRY_ARCH_AT)[0]
                first = entry + entry_header
                if arch in keep:
                    kept += payload
                else:
                    elf[first:first + payload] = bytes(payload)
                    zeroed += payload
                entry = first + payload
            pos = stop
    return kept, zeroed


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 strip_fatbin.py LIB.so ARCHS   (e.g. 90 or 90,100)", file=sys.stderr)
        return 2
    path, keep = Path(argv[0]), {int(a) for a in argv[1].split(",")}
    elf = bytearray(path.read_bytes())
    kept, zeroed = strip(elf, keep)
    path.write_bytes(elf)
    print(f"{path.name}: kept {kept / 1e6:.1f} MB of GPU code for sm {sorted(keep)}, zeroed "
          f"{zeroed / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
