package codec_test

// Fuzz targets that complement the per-codec ones (FuzzBytesDecode,
// FuzzStringDecode, FuzzIntDecode, FuzzJSONDecode, FuzzGobDecode): RawBytes'
// aliasing Decode, the Appender contract against arbitrary prefixes, and
// JSON and Gob on struct shapes the conformance types leave out (nested
// structs, arrays, maps of structs, pointers, floats, interface values).
//
// .ci/run runs each target for a few seconds; run one longer with
//
//	go test -run '^$' -fuzz '^FuzzAppendEncode$' -fuzztime 60s ./codec/
//
// A failing input is written to testdata/fuzz/FuzzXxx/: commit it with the
// fix, so the plain test run replays it as a regression case.

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/logbus/logbus/codec"
)

// FuzzRawBytesDecode checks RawBytes' Decode, the one that does not copy,
// on arbitrary bytes: it never fails, returns the stored bytes themselves
// (same contents, same memory, nil kept nil), caps the result at its length
// so that appending to it cannot write into the log's memory, and Encode of
// the result is a copy equal to the input.
func FuzzRawBytesDecode(f *testing.F) {
	f.Add([]byte{}, uint8(0))
	f.Add([]byte("hello"), uint8(3))
	f.Add([]byte{0x00, 0xff, 0x80}, uint8(1))
	c := codec.RawBytes()
	f.Fuzz(func(t *testing.T, data []byte, spare uint8) {
		// The stored record, with spare capacity holding bytes that must
		// survive an append to the decoded value.
		stored := make([]byte, len(data), len(data)+int(spare%16))
		copy(stored, data)
		full := stored[:cap(stored)]
		for i := len(data); i < len(full); i++ {
			full[i] = 0xa5
		}
		if data == nil {
			stored = nil
		}
		want := bytes.Clone(full)

		v, err := c.Decode(stored)
		if err != nil {
			t.Fatalf("Decode(% x): %v; RawBytes accepts anything", stored, err)
		}
		if !bytesEqual(v, stored) {
			t.Fatalf("Decode(%#v) = %#v, want the same bytes, nil kept apart from empty", stored, v)
		}
		if cap(v) != len(v) {
			t.Fatalf("Decode returned len %d cap %d, want cap == len", len(v), cap(v))
		}
		if len(v) > 0 && &v[0] != &stored[0] {
			t.Fatal("Decode copied; RawBytes hands out the stored bytes themselves")
		}
		_ = append(v, 0x5a)
		if !bytes.Equal(full, want) {
			t.Fatalf("appending to the decoded value wrote into the stored record: % x, want % x", full, want)
		}

		enc, err := c.Encode(v)
		if err != nil {
			t.Fatalf("Encode(Decode(% x)): %v", stored, err)
		}
		if !bytesEqual(enc, stored) {
			t.Fatalf("Encode(Decode(%#v)) = %#v, want the input back", stored, enc)
		}
		if len(enc) > 0 {
			enc[0] ^= 0xff
			if !bytes.Equal(full, want) {
				t.Fatal("Encode returned memory shared with its input")
			}
		}
	})
}

// FuzzAppendEncode checks the Appender contract for every Appender in the
// package, with values and prefixes built from the input: AppendEncode(dst,
// v) returns dst's bytes followed by exactly Encode(v)'s, leaves dst's own
// bytes alone whether it has room or must grow, writes into the room dst
// has rather than allocating, and with a nil dst returns Encode's bytes.
// Each value must also round-trip through Decode.
func FuzzAppendEncode(f *testing.F) {
	f.Add([]byte{}, []byte{}, uint64(0), false)
	f.Add([]byte("key="), []byte("value"), uint64(1), false)
	f.Add([]byte{0xff}, []byte(nil), uint64(math.MaxUint64), true)
	f.Add([]byte("prefix"), []byte{0x00, 0x80, 0xff}, uint64(1)<<63, false)
	f.Add(bytes.Repeat([]byte{7}, 40), bytes.Repeat([]byte("abc"), 30), uint64(0xfffe), false)
	f.Fuzz(func(t *testing.T, prefix, payload []byte, n uint64, nilValue bool) {
		value := payload
		if nilValue {
			value = nil
		}
		checkAppendEncode(t, codec.Bytes(), value, prefix, bytesEqual)
		checkAppendEncode(t, codec.RawBytes(), value, prefix, bytesEqual)
		checkAppendEncode(t, codec.String(), string(payload), prefix, nil)
		checkAppendEncode(t, codec.Int[int64](), int64(n), prefix, nil)
		checkAppendEncode(t, codec.Int[uint16](), uint16(n), prefix, nil)
		checkAppendEncode(t, codec.Int[int8](), int8(n), prefix, nil)
		checkAppendEncode(t, codec.Int[uint32](), uint32(n), prefix, nil)
		checkAppendEncode(t, codec.Int[int](), int(n), prefix, nil)

		// Bytes and RawBytes keep a nil value nil whatever dst holds, and
		// anything else non-nil, even when both are empty.
		for _, c := range []codec.Codec[[]byte]{codec.Bytes(), codec.RawBytes()} {
			dst := prefix[:len(prefix):len(prefix)] // so that appending cannot write into the input
			got, err := c.(codec.Appender[[]byte]).AppendEncode(dst, value)
			if err != nil || (got == nil) != (value == nil) {
				t.Fatalf("%T.AppendEncode(%#v, %#v) = %#v, %v; want nil exactly when the value is nil",
					c, prefix, value, got, err)
			}
		}
	})
}

// checkAppendEncode checks one value against one Appender; see
// FuzzAppendEncode. eq compares values; nil means reflect.DeepEqual.
func checkAppendEncode[T any](t *testing.T, c codec.Codec[T], v T, prefix []byte, eq func(a, b T) bool) {
	t.Helper()
	if eq == nil {
		eq = func(a, b T) bool { return reflect.DeepEqual(a, b) }
	}
	app, ok := c.(codec.Appender[T])
	if !ok {
		t.Fatalf("%T is not an Appender", c)
	}
	want, err := c.Encode(v)
	if err != nil {
		t.Fatalf("%T.Encode(%#v): %v", c, v, err)
	}
	back, err := c.Decode(want)
	if err != nil || !eq(back, v) {
		t.Fatalf("%T: Decode(Encode(%#v)) = %#v, %v; want the value back", c, v, back, err)
	}

	// No room (append must grow, and copy dst), exactly enough room, and
	// more than enough.
	for _, room := range []int{0, len(want), len(want) + 5} {
		dst := make([]byte, len(prefix), len(prefix)+room)
		copy(dst, prefix)
		got, err := app.AppendEncode(dst, v)
		if err != nil {
			t.Fatalf("%T.AppendEncode(% x, %#v): %v", c, prefix, v, err)
		}
		if !bytes.Equal(dst, prefix) {
			t.Fatalf("%T.AppendEncode changed dst's bytes to % x, want % x", c, dst, prefix)
		}
		if got == nil && want == nil {
			continue // a nil encoding stays nil and drops dst (Bytes)
		}
		if !bytes.Equal(got, append(bytes.Clone(prefix), want...)) {
			t.Fatalf("%T.AppendEncode(% x, %#v) = % x, want the prefix then % x", c, prefix, v, got, want)
		}
		if room >= len(want) && cap(dst) > 0 && len(got) > 0 && &got[0] != &dst[:1][0] {
			t.Fatalf("%T.AppendEncode allocated although dst had room for % x", c, want)
		}
	}

	got, err := app.AppendEncode(nil, v)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%T.AppendEncode(nil, %#v) = % x, %v; want % x", c, v, got, err, want)
	}
}

// jsonShape is a JSON record with the shapes jsonEvent lacks: floats,
// booleans, base64 bytes, arrays, nested structs, maps of pointers to
// structs and an interface field, which decodes to JSON's generic types.
// It has no omitempty: a decoded empty slice must survive re-encoding.
type jsonShape struct {
	Kind   string                `json:"kind"`
	OK     bool                  `json:"ok"`
	Ratio  float64               `json:"ratio"`
	Small  uint8                 `json:"small"`
	Raw    []byte                `json:"raw"`
	Grid   [2][2]int16           `json:"grid"`
	Inner  jsonInner             `json:"inner"`
	Items  []jsonInner           `json:"items"`
	ByName map[string]*jsonInner `json:"by_name"`
	Extra  any                   `json:"extra"`
}

type jsonInner struct {
	ID   int32    `json:"id"`
	Tags []string `json:"tags"`
}

// FuzzJSONShapes checks JSON on arbitrary bytes for jsonShape: Decode never
// panics, fails only with an error wrapping ErrDecode and the zero value, and
// a value it accepts re-encodes to bytes that decode to the same value and
// encode to the same bytes again (encoding/json sorts map keys, so the
// encoding is a fixed point after one round trip).
func FuzzJSONShapes(f *testing.F) {
	c := codec.JSON[jsonShape]()
	full := jsonShape{
		Kind: "order", OK: true, Ratio: -0.25, Small: 255, Raw: []byte{0, 1, 0xff},
		Grid:   [2][2]int16{{-1, 2}, {3, math.MinInt16}},
		Inner:  jsonInner{ID: 7, Tags: []string{"a", ""}},
		Items:  []jsonInner{{}, {ID: -1, Tags: []string{}}},
		ByName: map[string]*jsonInner{"x": {ID: 2}, "nil": nil},
		Extra:  map[string]any{"n": 1.5, "list": []any{true, nil, "s"}},
	}
	for _, v := range []jsonShape{{}, full} {
		b, err := c.Encode(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", "null", "{}", "[]", `{"kind":"\ud800"}`, `{"raw":"AAE="}`, `{"raw":"AAE"}`,
		`{"grid":[[1],[2,3,4]]}`, `{"ratio":1e309}`, `{"ratio":-0}`, `{"small":256}`,
		`{"extra":{"a":[1,{"b":null}],"c":1e-320}}`, `{"by_name":{"a":null,"a":{"id":1}}}`,
		`{"Inner":{"ID":1},"inner":{"tags":null}}`, `{"items":[null,{}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkZeroOnError(t, c, data)
		b, ok := checkDecode(t, c, data, nil)
		if !ok {
			return
		}
		v, err := c.Decode(b)
		if err != nil {
			t.Fatalf("Decode(% x): %v", b, err)
		}
		again, err := c.Encode(v)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("encoding is not a fixed point: %s, then %s (%v)", b, again, err)
		}
	})
}

// gobShape is a gob record with the shapes gobRecord lacks: nested structs,
// slices of structs, arrays, a map, a pointer and a float32 that a float64
// in the stream can overflow.
type gobShape struct {
	Name   string
	Flags  []bool
	Grid   [2][2]int8
	Inner  gobInner
	Items  []gobInner
	Counts map[string]int64
	Note   *string
	Ratio  float32
	U      uint16
}

type gobInner struct {
	ID   uint32
	Tags []string
	Raw  []byte
}

// FuzzGobShapes checks Gob on arbitrary bytes for gobShape: Decode never
// panics, fails only with an error wrapping ErrDecode and the zero value,
// and a value it accepts survives a round trip, compared as gob sees values
// (see sameAsGob).
func FuzzGobShapes(f *testing.F) {
	c := codec.Gob[gobShape]()
	note := "n"
	for _, v := range []gobShape{
		{},
		{Name: "x", Flags: []bool{false, true}, Grid: [2][2]int8{{1, -1}, {0, 127}},
			Inner: gobInner{ID: 1, Tags: []string{"", "t"}, Raw: []byte{0}},
			Items: []gobInner{{}, {ID: 9}}, Counts: map[string]int64{"a": -1, "": 0},
			Note: &note, Ratio: float32(math.Inf(-1)), U: 65535},
	} {
		b, err := c.Encode(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	// A stream of another type, whose fields mostly do not match gobShape's.
	if b, err := codec.Gob[gobRecord]().Encode(gobRecord{Key: "k", Score: math.NaN()}); err == nil {
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkZeroOnError(t, c, data)
		checkDecode(t, c, data, func(a, b gobShape) bool {
			return sameAsGob(reflect.ValueOf(a), reflect.ValueOf(b))
		})
	})
}

// checkZeroOnError checks that a failing Decode returns the zero T, as JSON
// and Gob promise, rather than a partly filled value.
func checkZeroOnError[T any](t *testing.T, c codec.Codec[T], data []byte) {
	t.Helper()
	v, err := c.Decode(data)
	if err == nil {
		return
	}
	if !errors.Is(err, codec.ErrDecode) {
		t.Fatalf("Decode error %q does not wrap ErrDecode", err)
	}
	if !reflect.ValueOf(&v).Elem().IsZero() {
		t.Fatalf("Decode failed (%v) but returned %#v, want the zero value", err, v)
	}
}

// sameAsGob reports whether a and b are equal as gob transmits values: gob
// does not send zero values, so nil and empty slices and maps are the same,
// and a nil pointer is the same as a pointer to a zero value; NaN equals
// NaN, and -0 equals 0.
func sameAsGob(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Pointer:
		switch {
		case a.IsNil() && b.IsNil():
			return true
		case a.IsNil():
			return sameAsGob(reflect.Zero(b.Type().Elem()), b.Elem())
		case b.IsNil():
			return sameAsGob(a.Elem(), reflect.Zero(a.Type().Elem()))
		}
		return sameAsGob(a.Elem(), b.Elem())
	case reflect.Slice, reflect.Array:
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !sameAsGob(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.Len() != b.Len() {
			return false
		}
		for it := a.MapRange(); it.Next(); {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() || !sameAsGob(it.Value(), bv) {
				return false
			}
		}
		return true
	case reflect.Struct:
		for i := range a.NumField() {
			if !sameAsGob(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Float32, reflect.Float64:
		x, y := a.Float(), b.Float()
		return x == y || (math.IsNaN(x) && math.IsNaN(y))
	}
	return a.Equal(b)
}
