package codec_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"slices"
	"testing"

	"github.com/logbus/logbus/codec"
	"pgregory.net/rapid"
)

// gobRecord has no maps: gob writes maps in iteration order, which would make
// encodings nondeterministic and defeat testCodec's byte comparisons.
type gobRecord struct {
	Key     string
	Offset  uint64
	Delta   int32
	Score   float64
	Payload []byte
	Tags    []string
}

// gobRecordEqual compares the way gob round-trips: nil and empty slices are
// the same, -0 decodes as 0 (gob does not send zero values), and NaN is
// equal to itself.
func gobRecordEqual(a, b gobRecord) bool {
	sameScore := a.Score == b.Score || (math.IsNaN(a.Score) && math.IsNaN(b.Score))
	return a.Key == b.Key && a.Offset == b.Offset && a.Delta == b.Delta && sameScore &&
		bytes.Equal(a.Payload, b.Payload) && slices.Equal(a.Tags, b.Tags)
}

var gobRecordGen = rapid.Custom(func(t *rapid.T) gobRecord {
	return gobRecord{
		Key:     rapid.String().Draw(t, "key"),
		Offset:  rapid.Uint64().Draw(t, "offset"),
		Delta:   rapid.Int32().Draw(t, "delta"),
		Score:   rapid.Float64().Draw(t, "score"),
		Payload: rapid.SliceOf(rapid.Byte()).Draw(t, "payload"),
		Tags:    rapid.SliceOf(rapid.String()).Draw(t, "tags"),
	}
})

func TestGob(t *testing.T) {
	testCodec(t, codec.Gob[gobRecord](), gobRecordGen, gobRecordEqual)
}

func TestGobEncodeErrors(t *testing.T) {
	type unexported struct{ n int }
	if b, err := codec.Gob[unexported]().Encode(unexported{1}); !errors.Is(err, codec.ErrEncode) || b != nil {
		t.Errorf("Encode(struct without exported fields) = %v, %v; want nil and ErrEncode", b, err)
	}
	if b, err := codec.Gob[*gobRecord]().Encode(nil); !errors.Is(err, codec.ErrEncode) || b != nil {
		t.Errorf("Encode(nil pointer) = %v, %v; want nil and ErrEncode", b, err)
	}
	var nilInAny any = (*gobRecord)(nil)
	if b, err := codec.Gob[any]().Encode(nilInAny); !errors.Is(err, codec.ErrEncode) || b != nil {
		t.Errorf("Encode(any holding nil pointer) = %v, %v; want nil and ErrEncode", b, err)
	}
}

func TestGobDecodeErrors(t *testing.T) {
	c := codec.Gob[gobRecord]()
	valid, err := c.Encode(gobRecord{Key: "k", Offset: 7, Tags: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}

	_, err = c.Decode(nil)
	if !errors.Is(err, codec.ErrDecode) || !errors.Is(err, io.EOF) {
		t.Errorf("Decode(nil) error = %v, want one wrapping ErrDecode and io.EOF", err)
	}
	for n := 1; n < len(valid); n++ {
		v, err := c.Decode(valid[:n])
		if !errors.Is(err, codec.ErrDecode) {
			t.Errorf("Decode(first %d of %d bytes) error = %v, want ErrDecode", n, len(valid), err)
		}
		if !gobRecordEqual(v, gobRecord{}) {
			t.Errorf("Decode(first %d bytes) = %#v on error, want the zero value", n, v)
		}
	}
	if _, err := c.Decode(append(bytes.Clone(valid), 0)); !errors.Is(err, codec.ErrDecode) {
		t.Errorf("Decode(valid + trailing byte) error = %v, want ErrDecode", err)
	}
	str, err := codec.Gob[string]().Encode("not a record")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decode(str); !errors.Is(err, codec.ErrDecode) {
		t.Errorf("Decode(gob string) error = %v, want ErrDecode", err)
	}
}

// TestGobRecordsAreIndependent checks that each record carries its own type
// description, so consumers can decode any record alone and in any order.
func TestGobRecordsAreIndependent(t *testing.T) {
	c := codec.Gob[gobRecord]()
	first, err := c.Encode(gobRecord{Key: "first"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Encode(gobRecord{Key: "second"})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range [][]byte{first, second} {
		if !bytes.Contains(rec, []byte("gobRecord")) {
			t.Errorf("record % x does not carry the type description", rec)
		}
		if cap(rec) != len(rec) {
			t.Errorf("record has capacity %d for %d bytes; the log would retain the slack", cap(rec), len(rec))
		}
	}
	for _, rec := range []struct {
		data []byte
		want string
	}{{second, "second"}, {first, "first"}} {
		v, err := c.Decode(rec.data)
		if err != nil || v.Key != rec.want {
			t.Errorf("Decode = %#v, %v; want Key %q", v, err, rec.want)
		}
	}
}

func FuzzGobDecode(f *testing.F) {
	c := codec.Gob[gobRecord]()
	for seed := range 5 {
		b, err := c.Encode(gobRecordGen.Example(seed))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
		f.Add(append(b, 0))
	}
	f.Add([]byte{})
	f.Add([]byte("garbage"))
	// Message length prefixes claiming far more data than follows: just over
	// gob's limit, and 1GB, which is under it.
	f.Add([]byte{0xf8, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{0xfc, 0x40, 0x00, 0x00, 0x00, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, c, data, gobRecordEqual)
	})
}
