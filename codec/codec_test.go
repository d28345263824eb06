package codec_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/logbus/logbus/codec"
	"pgregory.net/rapid"
)

// testCodec checks the Codec contract for values drawn from gen: values
// round-trip, Encode returns memory nobody else holds, Decode neither
// modifies nor aliases its input, and concurrent use is race-free. eq compares
// values; nil means reflect.DeepEqual. It assumes Encode is deterministic,
// which holds for every codec here (the gob test type has no maps, whose
// iteration order would vary).
func testCodec[T any](t *testing.T, c codec.Codec[T], gen *rapid.Generator[T], eq func(a, b T) bool) {
	t.Helper()
	if eq == nil {
		eq = func(a, b T) bool { return reflect.DeepEqual(a, b) }
	}
	rapid.Check(t, func(rt *rapid.T) {
		x := gen.Draw(rt, "x")
		a, err := c.Encode(x)
		if err != nil {
			rt.Fatalf("Encode(%#v): %v", x, err)
		}
		want := bytes.Clone(a)

		y, err := c.Decode(a)
		if err != nil {
			rt.Fatalf("Decode(Encode(%#v)): %v", x, err)
		}
		if !eq(x, y) {
			rt.Fatalf("Decode(Encode(x)) = %#v, want %#v", y, x)
		}
		if !bytes.Equal(a, want) {
			rt.Fatalf("Decode modified its input: % x, want % x", a, want)
		}

		if app, ok := c.(codec.Appender[T]); ok {
			checkAppend(rt, app, x, want)
		}

		b, err := c.Encode(x)
		if err != nil {
			rt.Fatalf("second Encode(%#v): %v", x, err)
		}
		if !bytes.Equal(b, want) {
			rt.Fatalf("Encode not deterministic: % x then % x", want, b)
		}

		// Scribble over every byte a could reach, spare capacity included.
		// If a shared memory with b, with a later encoding, with x or with y,
		// one of the checks below sees it.
		full := a[:cap(a)]
		for i := range full {
			full[i] ^= 0xff
		}
		if !bytes.Equal(b, want) {
			rt.Fatalf("two Encode results share memory: % x, want % x", b, want)
		}
		again, err := c.Encode(x)
		if err != nil {
			rt.Fatalf("third Encode(%#v): %v", x, err)
		}
		if !bytes.Equal(again, want) {
			rt.Fatalf("Encode returned memory the codec reuses: % x, want % x", again, want)
		}
		if !eq(x, y) {
			rt.Fatalf("decoded value aliases the encoded bytes: got %#v, want %#v", y, x)
		}
	})
	testConcurrent(t, c, gen.Example(), eq)
}

// checkAppend checks that AppendEncode appends exactly Encode's bytes
// (want) after whatever dst holds, leaves dst's bytes alone, and fills the
// spare capacity it is given rather than allocating.
func checkAppend[T any](rt *rapid.T, app codec.Appender[T], x T, want []byte) {
	prefix := rapid.SliceOf(rapid.Byte()).Draw(rt, "prefix")
	dst := make([]byte, len(prefix), len(prefix)+len(want)+rapid.IntRange(0, 8).Draw(rt, "spare"))
	copy(dst, prefix)
	got, err := app.AppendEncode(dst, x)
	if err != nil {
		rt.Fatalf("AppendEncode(%#v): %v", x, err)
	}
	if got == nil && want == nil {
		return // a nil encoding, kept nil (Bytes)
	}
	if !bytes.Equal(got, append(bytes.Clone(prefix), want...)) {
		rt.Fatalf("AppendEncode(% x, %#v) = % x, want the prefix then % x", prefix, x, got, want)
	}
	if len(got) > 0 && &got[0] != &dst[:1][0] {
		rt.Fatalf("AppendEncode allocated although dst had room for % x", want)
	}
}

// testConcurrent encodes and decodes v from several goroutines at once, so
// the race detector can catch shared state in a codec.
func testConcurrent[T any](t *testing.T, c codec.Codec[T], v T, eq func(a, b T) bool) {
	t.Helper()
	want, err := c.Encode(v)
	if err != nil {
		t.Fatalf("Encode(%#v): %v", v, err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				b, err := c.Encode(v)
				if err != nil || !bytes.Equal(b, want) {
					t.Errorf("concurrent Encode = % x, %v; want % x", b, err, want)
					return
				}
				got, err := c.Decode(b)
				if err != nil || !eq(got, v) {
					t.Errorf("concurrent Decode = %#v, %v; want %#v", got, err, v)
					return
				}
			}
		})
	}
	wg.Wait()
}

// checkDecode is the body shared by the fuzz targets. Decode must not panic
// or modify data, must fail only with an error wrapping ErrDecode, and a value
// it accepts must survive another round trip. It returns the re-encoding of
// the decoded value, or ok == false if data was rejected. eq compares
// values; nil means reflect.DeepEqual.
func checkDecode[T any](t *testing.T, c codec.Codec[T], data []byte, eq func(a, b T) bool) (reencoded []byte, ok bool) {
	t.Helper()
	if eq == nil {
		eq = func(a, b T) bool { return reflect.DeepEqual(a, b) }
	}
	orig := bytes.Clone(data)
	v, err := c.Decode(data)
	if !bytes.Equal(data, orig) {
		t.Fatalf("Decode modified its input: % x, want % x", data, orig)
	}
	if err != nil {
		if !errors.Is(err, codec.ErrDecode) {
			t.Fatalf("Decode error %q does not wrap ErrDecode", err)
		}
		return nil, false
	}
	b, err := c.Encode(v)
	if err != nil {
		t.Fatalf("Encode(Decode(% x) = %#v): %v", data, v, err)
	}
	v2, err := c.Decode(b)
	if err != nil {
		t.Fatalf("Decode(Encode(%#v)): %v", v, err)
	}
	if !eq(v, v2) {
		t.Fatalf("round trip of decoded value changed it: %#v, want %#v", v2, v)
	}
	return b, true
}

// point and pointCodec exercise Func with a hand-written binary format.
type point struct{ X, Y int32 }

var errPointLen = errors.New("point: want 8 bytes")

func pointCodec() codec.Codec[point] {
	return codec.Func(
		func(p point) ([]byte, error) {
			b := make([]byte, 8)
			binary.BigEndian.PutUint32(b, uint32(p.X))
			binary.BigEndian.PutUint32(b[4:], uint32(p.Y))
			return b, nil
		},
		func(b []byte) (point, error) {
			if len(b) != 8 {
				return point{}, fmt.Errorf("got %d bytes: %w", len(b), errPointLen)
			}
			return point{
				X: int32(binary.BigEndian.Uint32(b)),
				Y: int32(binary.BigEndian.Uint32(b[4:])),
			}, nil
		},
	)
}

func TestFunc(t *testing.T) {
	gen := rapid.Custom(func(t *rapid.T) point {
		return point{X: rapid.Int32().Draw(t, "x"), Y: rapid.Int32().Draw(t, "y")}
	})
	testCodec(t, pointCodec(), gen, nil)
}

func TestFuncWrapsErrors(t *testing.T) {
	_, err := pointCodec().Decode([]byte{1, 2, 3})
	if !errors.Is(err, codec.ErrDecode) || !errors.Is(err, errPointLen) {
		t.Errorf("Decode error %q: want it to wrap both ErrDecode and errPointLen", err)
	}

	errBoom := errors.New("boom")
	c := codec.Func(
		func(int) ([]byte, error) { return nil, errBoom },
		func([]byte) (int, error) { return 7, errBoom },
	)
	b, err := c.Encode(1)
	if !errors.Is(err, codec.ErrEncode) || !errors.Is(err, errBoom) || b != nil {
		t.Errorf("Encode = %v, %q; want nil and an error wrapping ErrEncode and errBoom", b, err)
	}
	v, err := c.Decode(nil)
	if !errors.Is(err, codec.ErrDecode) || !errors.Is(err, errBoom) || v != 0 {
		t.Errorf("Decode = %v, %q; want 0 and an error wrapping ErrDecode and errBoom", v, err)
	}
}

func TestFuncDoesNotRewrapSentinels(t *testing.T) {
	encErr := fmt.Errorf("custom: %w", codec.ErrEncode)
	decErr := fmt.Errorf("custom: %w", codec.ErrDecode)
	c := codec.Func(
		func(int) ([]byte, error) { return nil, encErr },
		func([]byte) (int, error) { return 0, decErr },
	)
	if _, err := c.Encode(1); err != encErr {
		t.Errorf("Encode error = %q, want %q unchanged", err, encErr)
	}
	if _, err := c.Decode(nil); err != decErr {
		t.Errorf("Decode error = %q, want %q unchanged", err, decErr)
	}
}

func TestFuncNilFunctions(t *testing.T) {
	c := codec.Func[int](nil, nil)
	if b, err := c.Encode(1); !errors.Is(err, codec.ErrEncode) || b != nil {
		t.Errorf("Encode with nil encode = %v, %v; want nil and ErrEncode", b, err)
	}
	if v, err := c.Decode([]byte{1}); !errors.Is(err, codec.ErrDecode) || v != 0 {
		t.Errorf("Decode with nil decode = %v, %v; want 0 and ErrDecode", v, err)
	}
}
