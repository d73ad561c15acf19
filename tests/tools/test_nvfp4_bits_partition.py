"""The cover search behind NOTES' claim that no NVFP4 word order decodes every pair with one shift and one mask."""
from atlas.tools.dev.nvfp4_bits_partition import S, covers


def test_search_finds_covers_where_they_exist():
    """Positions that do tile a word (a byte in each half-word pair, or a run of 8) are found, every cover exact."""
    for bits in ((0, 1, 2, 3, 16, 17, 18, 19), tuple(range(8)), (0, 2, 4, 6, 8, 10, 12, 14)):
        for words, rotate in ((1, True), (1, False), (2, False)):
            found = covers(words, rotate, bits)
            assert found, (bits, words, rotate)
            for shifts in found:
                pos = [(p + d) % (32 * words) if rotate else p + d for d in shifts for p in bits]
                assert sorted(pos) == list(range(32 * words))


def test_no_cover_of_the_bf16_pair_positions():
    assert S == (6, 7, 8, 15, 22, 23, 24, 31)
    assert covers(1, True) == [] and all(covers(w, False) == [] for w in (1, 2, 4))
