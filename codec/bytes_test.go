package codec_test

import (
	"bytes"
	"testing"

	"github.com/logbus/logbus/codec"
	"pgregory.net/rapid"
)

// bytesEqual is bytes.Equal that also tells nil from empty, because Bytes
// promises to preserve the difference.
func bytesEqual(a, b []byte) bool {
	return bytes.Equal(a, b) && (a == nil) == (b == nil)
}

func TestBytes(t *testing.T) {
	gen := rapid.OneOf(rapid.Just([]byte(nil)), rapid.SliceOf(rapid.Byte()))
	testCodec(t, codec.Bytes(), gen, bytesEqual)
}

func TestBytesEncodeCopiesInput(t *testing.T) {
	in := []byte("hello")
	stored, err := codec.Bytes().Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	in[0] = 'J' // the publisher reuses its buffer after Publish
	if string(stored) != "hello" {
		t.Errorf("stored record = %q after caller mutated its input, want %q", stored, "hello")
	}
	if cap(stored) != len(stored) {
		t.Errorf("stored record has capacity %d for %d bytes; the log would retain the slack", cap(stored), len(stored))
	}
}

func TestBytesDecodeCopiesOutput(t *testing.T) {
	c := codec.Bytes()
	stored, err := c.Encode([]byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Decode(stored)
	if err != nil {
		t.Fatal(err)
	}
	v[0] = 'J' // one consumer group's handler mutates its value
	if string(stored) != "hello" {
		t.Errorf("stored record = %q after a handler mutated its value, want %q", stored, "hello")
	}
	other, err := c.Decode(stored)
	if err != nil {
		t.Fatal(err)
	}
	if string(other) != "hello" {
		t.Errorf("another consumer decoded %q, want %q", other, "hello")
	}
}

func TestBytesNil(t *testing.T) {
	c := codec.Bytes()
	for _, in := range [][]byte{nil, {}} {
		enc, err := c.Encode(in)
		if err != nil || !bytesEqual(enc, in) {
			t.Errorf("Encode(%#v) = %#v, %v; want %#v", in, enc, err, in)
		}
		dec, err := c.Decode(in)
		if err != nil || !bytesEqual(dec, in) {
			t.Errorf("Decode(%#v) = %#v, %v; want %#v", in, dec, err, in)
		}
	}
}

// AppendEncode keeps nil apart from empty whatever dst holds: a nil value
// gives nil even into a non-empty dst, and an empty one a non-nil slice even
// into a nil dst.
func TestBytesAppendEncodeNil(t *testing.T) {
	app := codec.Bytes().(codec.Appender[[]byte])
	if got, err := app.AppendEncode([]byte("old"), nil); err != nil || got != nil {
		t.Errorf("AppendEncode(\"old\", nil) = %#v, %v; want nil", got, err)
	}
	if got, err := app.AppendEncode(nil, []byte{}); err != nil || got == nil || len(got) != 0 {
		t.Errorf("AppendEncode(nil, []byte{}) = %#v, %v; want empty and non-nil", got, err)
	}
}

func FuzzBytesDecode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("hello"))
	f.Add([]byte{0x00, 0xff, 0x80})
	c := codec.Bytes()
	f.Fuzz(func(t *testing.T, data []byte) {
		b, ok := checkDecode(t, c, data, bytesEqual)
		if !ok {
			t.Fatalf("Decode(% x) failed; Bytes accepts anything", data)
		}
		if !bytes.Equal(b, data) {
			t.Fatalf("re-encoding = % x, want % x", b, data)
		}
	})
}
