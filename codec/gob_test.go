package codec_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"runtime"
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

// gobKey and gobValue are structs, so a map of them decodes element by
// element even where the input has run out (a struct reads fields until
// its input ends).
type (
	gobKey     struct{ A int }
	gobValue   struct{ B int }
	gobWithMap struct {
		X int
		M map[gobKey]gobValue
	}
)

// forgeGobMapCount returns the Gob record of v, a gobWithMap with X set and
// one map entry, with the map's element count replaced by n and nothing
// after it: the attack the security review found, a record no longer than
// an honest one.
func forgeGobMapCount(t *testing.T, v gobWithMap, n uint64) []byte {
	t.Helper()
	rec, err := codec.Gob[gobWithMap]().Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	// The record is messages, each preceded by its length; the last one is
	// the value: its type id, then field X (delta 1, value), then field M
	// (delta 1) whose first byte is the count.
	var last int
	for at := 0; at < len(rec); {
		size, width := gobUint(rec[at:])
		last, at = at+width, at+width+int(size)
	}
	_, idWidth := gobUint(rec[last:])
	_, xWidth := gobUint(rec[last+idWidth+1:])
	count := last + idWidth + 1 + xWidth + 1
	if rec[count] != 1 {
		t.Fatalf("the map count is not where it should be in % x", rec)
	}
	body := append(bytes.Clone(rec[last:count]), putGobUint(n)...)
	return append(append(bytes.Clone(rec[:last-1]), putGobUint(uint64(len(body)))...), body...)
}

// gobUint reads gob's encoding of an unsigned integer: one byte below 128,
// else a byte holding the negated count of big-endian bytes that follow.
func gobUint(b []byte) (v uint64, width int) {
	if b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	n := int(-int8(b[0]))
	for _, c := range b[1 : 1+n] {
		v = v<<8 | uint64(c)
	}
	return v, 1 + n
}

func putGobUint(v uint64) []byte {
	if v < 0x80 {
		return []byte{byte(v)}
	}
	var be []byte
	for ; v > 0; v >>= 8 {
		be = append([]byte{byte(v)}, be...)
	}
	return append([]byte{byte(-int8(len(be)))}, be...)
}

// Gob's doc says a forged record of about a hundred bytes makes Decode
// allocate in proportion to the count it claims, not to its length: this
// pins that claim on the Go it runs on. If it fails, encoding/gob has come
// to bound its maps, and Gob's doc should say what holds now.
func TestGobDecodeOfAForgedMapCountIsUnbounded(t *testing.T) {
	c := codec.Gob[gobWithMap]()
	honest, err := c.Encode(gobWithMap{X: 1, M: map[gobKey]gobValue{{1}: {2}}})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.Decode(forgeGobMapCount(t, gobWithMap{X: 1, M: map[gobKey]gobValue{{1}: {2}}}, 1)); err == nil && len(v.M) > 1 {
		t.Fatalf("the forging is broken: a count of 1 decoded as %+v", v)
	}
	hostile := forgeGobMapCount(t, gobWithMap{X: 1, M: map[gobKey]gobValue{{1}: {2}}}, 1<<20)
	if len(hostile) > len(honest)+8 {
		t.Fatalf("the forged record is %d bytes, want no more than an honest record of one entry (%d)", len(hostile), len(honest))
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _ = c.Decode(hostile) // may well succeed: the map then holds one entry
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("Decode of a %d-byte record claiming 2^20 map entries allocated %d MiB", len(hostile), allocated>>20)
	if allocated < 16<<20 {
		t.Errorf("Decode of a %d-byte record claiming 2^20 map entries allocated %d KiB; Gob's doc says it allocates by the count (tens of MiB here)",
			len(hostile), allocated>>10)
	}
}
