package codec_test

import (
	"bytes"
	"testing"

	"github.com/logbus/logbus/codec"
	"pgregory.net/rapid"
)

func TestString(t *testing.T) {
	// Include invalid UTF-8: String must not validate or rewrite bytes.
	raw := rapid.Map(rapid.SliceOf(rapid.Byte()), func(b []byte) string { return string(b) })
	testCodec(t, codec.String(), rapid.OneOf(rapid.String(), raw), nil)
}

func TestStringInvalidUTF8(t *testing.T) {
	in := "a\xffb"
	b, err := codec.String().Encode(in)
	if err != nil || !bytes.Equal(b, []byte{'a', 0xff, 'b'}) {
		t.Fatalf("Encode(%q) = % x, %v; want 61 ff 62", in, b, err)
	}
	s, err := codec.String().Decode(b)
	if err != nil || s != in {
		t.Errorf("Decode(% x) = %q, %v; want %q", b, s, err, in)
	}
}

func FuzzStringDecode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("hello, 世界"))
	f.Add([]byte{0xff, 0xfe, 0x00})
	c := codec.String()
	f.Fuzz(func(t *testing.T, data []byte) {
		b, ok := checkDecode(t, c, data, nil)
		if !ok {
			t.Fatalf("Decode(% x) failed; String accepts anything", data)
		}
		if !bytes.Equal(b, data) {
			t.Fatalf("re-encoding = % x, want % x", b, data)
		}
	})
}
