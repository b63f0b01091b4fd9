# tests/reliability/make_idx.py OUT_DIR SPLIT N SIZE LABELS — writes a tiny raw IDX split (MNIST layout):
# <prefix>-images-idx3-ubyte and <prefix>-labels-idx1-ubyte, prefix train or t10k. LABELS is a comma list
# cycled over the N records (so a test can put an out-of-range label last).
import os, struct, sys
out, split, n, size, labels = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
labels = [int(x) for x in labels.split(",")]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, split + "-images-idx3-ubyte"), "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, size, size))
    f.write(bytes((i * 7 + j * 3) % 256 for i in range(n) for j in range(size * size)))
with open(os.path.join(out, split + "-labels-idx1-ubyte"), "wb") as f:
    f.write(struct.pack(">II", 0x801, n))
    f.write(bytes(labels[i % len(labels)] if i < n - 1 else labels[-1] for i in range(n)))
