package pubsub_test

import (
	"hash/crc32"
	"testing"

	"github.com/logbus/logbus/pubsub"
)

// FuzzKeyHash checks the default partitioner's promise for arbitrary key
// bytes and partition counts from 1 to 1<<16: a keyed record goes to
// CRC-32 (IEEE) of its encoded key mod the partition count, which is in
// [0, n), the same for equal keys whatever memory holds them (the hash reads
// eight bytes at a time, so the key is also tried at every alignment), the
// same from a fresh KeyHash (no state), and the same from Sticky, which
// promises to hash keyed records like KeyHash. A keyless record also lands
// in [0, n).
//
// Run it longer with
//
//	go test -run '^$' -fuzz '^FuzzKeyHash$' -fuzztime 60s ./pubsub/
func FuzzKeyHash(f *testing.F) {
	f.Add([]byte("alice"), uint16(1))
	f.Add([]byte{}, uint16(0))
	f.Add([]byte("user-42"), uint16(15))
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde"), uint16(2)) // 63 bytes: the last before the library takes over
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"), uint16(0xffff))
	f.Add([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0x80}, uint16(6))
	kh := pubsub.KeyHash()
	f.Fuzz(func(t *testing.T, key []byte, count uint16) {
		n := int(count) + 1 // 1 .. 1<<16
		if key == nil {
			key = []byte{} // an empty key is a key; nil would mean keyless
		}
		want := int(crc32.ChecksumIEEE(key) % uint32(n))

		got := kh.Partition(key, n)
		if got < 0 || got >= n {
			t.Fatalf("KeyHash().Partition(% x, %d) = %d, outside [0, %d)", key, n, got, n)
		}
		if got != want {
			t.Fatalf("KeyHash().Partition(% x, %d) = %d, want CRC-32 %#x mod %d = %d",
				key, n, got, crc32.ChecksumIEEE(key), n, want)
		}
		if again := pubsub.KeyHash().Partition(key, n); again != got {
			t.Fatalf("a fresh KeyHash sent key % x to %d, the first to %d", key, again, got)
		}
		if s := pubsub.Sticky(int(count)).Partition(key, n); s != got {
			t.Fatalf("Sticky sent key % x to %d, KeyHash to %d", key, s, got)
		}
		// An equal key in other memory, at each offset within a word.
		for shift := 1; shift < 8; shift++ {
			buf := make([]byte, shift+len(key))
			moved := buf[shift:]
			copy(moved, key)
			if p := kh.Partition(moved, n); p != got {
				t.Fatalf("key % x at offset %d went to %d, the same key elsewhere to %d", key, shift, p, got)
			}
		}

		if p := kh.Partition(nil, n); p < 0 || p >= n {
			t.Fatalf("KeyHash().Partition(nil, %d) = %d, outside [0, %d)", n, p, n)
		}
	})
}
