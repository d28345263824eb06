package codec_test

import (
	"bytes"
	"testing"

	"github.com/logbus/logbus/codec"
	"pgregory.net/rapid"
)

// RawBytes keeps Bytes' contract on the encoding side and round-trips the
// same way, but its Decode returns its input itself, capped at its length.
func TestRawBytes(t *testing.T) {
	c := codec.RawBytes()
	app, ok := c.(codec.Appender[[]byte])
	if !ok {
		t.Fatal("RawBytes is not an Appender")
	}
	rapid.Check(t, func(rt *rapid.T) {
		x := rapid.OneOf(rapid.Just([]byte(nil)), rapid.SliceOf(rapid.Byte())).Draw(rt, "x")
		stored, err := c.Encode(x)
		if err != nil || !bytesEqual(stored, x) {
			rt.Fatalf("Encode(%#v) = %#v, %v", x, stored, err)
		}
		if len(x) > 0 && &stored[0] == &x[0] {
			rt.Fatalf("Encode returned its input; the publisher may reuse it")
		}
		checkAppend(rt, app, x, bytes.Clone(stored))

		// The log's buffer, with spare room as a reused one has.
		buf := append(make([]byte, 0, len(stored)+8), stored...)
		if stored == nil {
			buf = nil
		}
		got, err := c.Decode(buf)
		if err != nil || !bytesEqual(got, x) {
			rt.Fatalf("Decode(Encode(%#v)) = %#v, %v", x, got, err)
		}
		if len(got) > 0 && &got[0] != &buf[0] {
			rt.Fatalf("Decode copied; RawBytes hands out the stored bytes")
		}
		if cap(got) != len(got) {
			rt.Fatalf("decoded capacity %d for %d bytes: an append would write into the log's buffer", cap(got), len(got))
		}
		if !bytesEqual(buf, stored) {
			rt.Fatalf("Decode modified its input: %#v, want %#v", buf, stored)
		}
	})
	testConcurrent(t, c, []byte("hello"), bytesEqual)
}

func TestRawBytesAppendLeavesTheStoredBytesAlone(t *testing.T) {
	stored := append(make([]byte, 0, 16), "hello"...)
	v, err := codec.RawBytes().Decode(stored)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(v, " world"...) // a handler that builds on its value
	if got := stored[:cap(stored)][len(stored):11]; !bytes.Equal(got, make([]byte, 6)) {
		t.Errorf("append wrote %q into the stored buffer's spare room", got)
	}
}
