"""The streaming kernels' traffic model on a case small enough to count by hand."""

from benchmarks.model.streaming_traffic import (Tiles, forward_bytes, gemm_bytes, grad_hidden_bytes, grad_weight_bytes,
                                          streaming_bytes)

# N=128 tokens, H=64, V=256, 2-byte inputs, [64, 128] tiles, 1 SM (so every program is its own wave)
N, H, V, TILES = 128, 64, 256, Tiles(64, 128)


def test_forward_bytes_by_hand():
    weight = 2 * (256 * 64 * 2)  # two token blocks, one per wave, each streams W
    hidden = 2 * (128 * 64 * 2)  # every token's hidden row re-read once per vocabulary tile (2 tiles)
    outputs = 3 * 4 * 128  # logps, entropy, lse in float32
    assert forward_bytes(N, H, V, TILES, s=2, sms=1) == weight + hidden + outputs == 99840


def test_backward_bytes_by_hand():
    grad_hidden = (2 * 32768  # W streamed by two waves
                   + 2 * 16384  # hidden re-read per vocabulary tile
                   + 2 * (128 * 64 * 4 * 2)  # float32 dH read + written per vocabulary tile
                   + 128 * 64 * 6)  # final cast: read 4 bytes, write 2
    grad_weight = (2 * 16384  # hidden streamed by two waves (two vocabulary blocks)
                   + 2 * 32768  # each program's W slice re-read per token tile
                   + 2 * (256 * 64 * 4 * 2)  # float32 dW read + written per token tile
                   + 256 * 64 * 6)
    assert grad_hidden_bytes(N, H, V, TILES, s=2, sms=1) == grad_hidden == 278528
    assert grad_weight_bytes(N, H, V, TILES, s=2, sms=1) == grad_weight == 458752
    assert streaming_bytes(N, H, V, TILES, TILES, TILES, s=2, sms=1)["grad_weight"] == grad_weight


def test_gemm_bytes_by_hand():
    logits = (128 * 64 + 256 * 64 + 128 * 256) * 2
    assert gemm_bytes(N, H, V) == {"forward": logits, "backward": logits + 2 * (128 * 256 + 256 * 64 + 128 * 64) * 2}


def test_wider_reduction_tiles_move_fewer_bytes():
    big = dict(N=8192, H=4096, V=151936)
    assert grad_hidden_bytes(**big, tiles=Tiles(32, 512)) < grad_hidden_bytes(**big, tiles=Tiles(64, 128)) / 3
    assert grad_weight_bytes(**big, tiles=Tiles(512, 16)) < grad_weight_bytes(**big, tiles=Tiles(64, 128)) / 7
