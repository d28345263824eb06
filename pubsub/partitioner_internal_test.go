package pubsub

import (
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestKeyHashStable pins the key → partition mapping: it is CRC-32 (IEEE) of
// the key bytes, so it must not change between processes or releases.
func TestKeyHashStable(t *testing.T) {
	p := KeyHash()
	for key, want := range map[string]int{"alice": 1, "bob": 0, "carol": 1, "": 0} {
		for range 50 {
			if got := p.Partition([]byte(key), 2); got != want {
				t.Fatalf("key %q went to partition %d, want %d", key, got, want)
			}
		}
	}
	if got, want := p.Partition([]byte("user-42"), 16), 3; got != want {
		t.Errorf("user-42 of 16 partitions: got %d, want %d", got, want)
	}
}

// TestChecksumIEEEIsTheLibrarys checks the key hash's own CRC-32 against
// hash/crc32 on every length from 0 to 150 bytes, around its 8-byte steps
// and its hand-over to the library at 64 bytes, with random contents.
func TestChecksumIEEEIsTheLibrarys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 151 {
		p := make([]byte, n)
		for range 20 {
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			if got, want := checksumIEEE(p), crc32.ChecksumIEEE(p); got != want {
				t.Fatalf("checksumIEEE(%x) = %#x, want %#x", p, got, want)
			}
		}
	}
}

func TestRoundRobinSpreads(t *testing.T) {
	for name, p := range map[string]Partitioner{"RoundRobin": RoundRobin(), "KeyHash keyless": KeyHash()} {
		counts := make([]int, 4)
		for range 40 {
			counts[p.Partition(nil, 4)]++
		}
		if !slices.Equal(counts, []int{10, 10, 10, 10}) {
			t.Errorf("%s: 40 keyless records spread as %v, want 10 each", name, counts)
		}
	}
}

func TestStickyFillsABatchThenMoves(t *testing.T) {
	p := Sticky(3)
	var got []int
	for range 7 {
		got = append(got, p.Partition(nil, 2))
	}
	if want := []int{0, 0, 0, 1, 1, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("sticky(3) keyless sequence %v, want %v", got, want)
	}
	if a, b := p.Partition([]byte("alice"), 2), KeyHash().Partition([]byte("alice"), 2); a != b {
		t.Errorf("sticky routes a keyed record to %d, key hash to %d", a, b)
	}
}
