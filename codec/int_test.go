package codec_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/logbus/logbus/codec"
	"golang.org/x/exp/constraints"
	"pgregory.net/rapid"
)

// offset checks that Int accepts named integer types.
type offset int64

func TestInt(t *testing.T) {
	t.Run("int8", func(t *testing.T) { testCodec(t, codec.Int[int8](), rapid.Int8(), nil) })
	t.Run("int16", func(t *testing.T) { testCodec(t, codec.Int[int16](), rapid.Int16(), nil) })
	t.Run("int32", func(t *testing.T) { testCodec(t, codec.Int[int32](), rapid.Int32(), nil) })
	t.Run("int64", func(t *testing.T) { testCodec(t, codec.Int[int64](), rapid.Int64(), nil) })
	t.Run("int", func(t *testing.T) { testCodec(t, codec.Int[int](), rapid.Int(), nil) })
	t.Run("uint8", func(t *testing.T) { testCodec(t, codec.Int[uint8](), rapid.Uint8(), nil) })
	t.Run("uint16", func(t *testing.T) { testCodec(t, codec.Int[uint16](), rapid.Uint16(), nil) })
	t.Run("uint32", func(t *testing.T) { testCodec(t, codec.Int[uint32](), rapid.Uint32(), nil) })
	t.Run("uint64", func(t *testing.T) { testCodec(t, codec.Int[uint64](), rapid.Uint64(), nil) })
	t.Run("uint", func(t *testing.T) { testCodec(t, codec.Int[uint](), rapid.Uint(), nil) })
	t.Run("offset", func(t *testing.T) {
		gen := rapid.Map(rapid.Int64(), func(n int64) offset { return offset(n) })
		testCodec(t, codec.Int[offset](), gen, nil)
	})
}

// checkWire asserts that v encodes to exactly want and that want decodes to v.
func checkWire[T constraints.Integer](t *testing.T, v T, want []byte) {
	t.Helper()
	c := codec.Int[T]()
	got, err := c.Encode(v)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("Int[%T].Encode(%d) = % x, %v; want % x", v, v, got, err, want)
	}
	back, err := c.Decode(want)
	if err != nil || back != v {
		t.Errorf("Int[%T].Decode(% x) = %d, %v; want %d", v, want, back, err, v)
	}
}

func TestIntWireFormat(t *testing.T) {
	checkWire(t, int8(-1), []byte{0xff})
	checkWire(t, int8(math.MinInt8), []byte{0x80})
	checkWire(t, uint8(0xab), []byte{0xab})
	checkWire(t, int16(-2), []byte{0xff, 0xfe})
	checkWire(t, int16(0x0102), []byte{0x01, 0x02})
	checkWire(t, uint16(math.MaxUint16), []byte{0xff, 0xff})
	checkWire(t, uint32(258), []byte{0x00, 0x00, 0x01, 0x02})
	checkWire(t, int32(math.MinInt32), []byte{0x80, 0x00, 0x00, 0x00})
	checkWire(t, int64(-2), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe})
	checkWire(t, int64(math.MaxInt64), []byte{0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	checkWire(t, uint64(0x0102030405060708), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	checkWire(t, offset(258), []byte{0, 0, 0, 0, 0, 0, 0x01, 0x02})
}

func TestIntPlatformWidth(t *testing.T) {
	want := strconv.IntSize / 8
	for _, enc := range []func() ([]byte, error){
		func() ([]byte, error) { return codec.Int[int]().Encode(-1) },
		func() ([]byte, error) { return codec.Int[uint]().Encode(1) },
		func() ([]byte, error) { return codec.Int[uintptr]().Encode(1) },
	} {
		if b, err := enc(); err != nil || len(b) != want {
			t.Errorf("platform-sized Encode = % x, %v; want %d bytes", b, err, want)
		}
	}
}

// checkWrongLength asserts that Int[T] rejects every length but its width.
func checkWrongLength[T constraints.Integer](t *testing.T) {
	t.Helper()
	c := codec.Int[T]()
	width := int(reflect.TypeFor[T]().Size())
	name := reflect.TypeFor[T]().String()
	for _, n := range []int{0, width - 1, width + 1, 2 * width} {
		v, err := c.Decode(make([]byte, n))
		if !errors.Is(err, codec.ErrDecode) {
			t.Errorf("Int[%s].Decode(%d bytes) error = %v, want ErrDecode", name, n, err)
			continue
		}
		if v != 0 {
			t.Errorf("Int[%s].Decode(%d bytes) = %d on error, want 0", name, n, v)
		}
		if msg := err.Error(); !strings.Contains(msg, name) || !strings.Contains(msg, "got "+strconv.Itoa(n)) {
			t.Errorf("Int[%s].Decode(%d bytes) error %q lacks type or length", name, n, msg)
		}
	}
	if _, err := c.Decode(nil); !errors.Is(err, codec.ErrDecode) {
		t.Errorf("Int[%s].Decode(nil) error = %v, want ErrDecode", name, err)
	}
}

func TestIntWrongLength(t *testing.T) {
	checkWrongLength[int8](t)
	checkWrongLength[int16](t)
	checkWrongLength[int32](t)
	checkWrongLength[int64](t)
	checkWrongLength[int](t)
	checkWrongLength[uint8](t)
	checkWrongLength[uint16](t)
	checkWrongLength[uint32](t)
	checkWrongLength[uint64](t)
	checkWrongLength[uint](t)
}

// fuzzInt checks one integer type against arbitrary input: data of exactly
// the width must decode and re-encode to itself, anything else must fail.
func fuzzInt[T constraints.Integer](t *testing.T, data []byte) {
	t.Helper()
	c := codec.Int[T]()
	b, ok := checkDecode(t, c, data, nil)
	width := int(reflect.TypeFor[T]().Size())
	switch {
	case ok != (len(data) == width):
		t.Fatalf("Int[%T].Decode(% x) ok = %v, want %v", T(0), data, ok, len(data) == width)
	case ok && !bytes.Equal(b, data):
		t.Fatalf("Int[%T] re-encoding = % x, want % x", T(0), b, data)
	}
}

func FuzzIntDecode(f *testing.F) {
	for _, s := range [][]byte{
		{}, {0x80}, {0xff, 0xfe}, {1, 2, 3}, {0, 0, 1, 2},
		{0x80, 0, 0, 0, 0, 0, 0, 0}, {1, 2, 3, 4, 5, 6, 7, 8, 9},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzInt[int8](t, data)
		fuzzInt[int16](t, data)
		fuzzInt[int32](t, data)
		fuzzInt[int64](t, data)
		fuzzInt[int](t, data)
		fuzzInt[uint8](t, data)
		fuzzInt[uint16](t, data)
		fuzzInt[uint32](t, data)
		fuzzInt[uint64](t, data)
		fuzzInt[uint](t, data)
	})
}
