package codec

import (
	"fmt"
	"reflect"

	"golang.org/x/exp/constraints"
)

// Int returns a Codec for integers in fixed-width big-endian form.
//
// The width is the size of T: 1, 2, 4 or 8 bytes. Signed values are stored in
// two's complement, so Int[int16] encodes -2 as 0xff 0xfe. Big-endian order
// makes the bytes of unsigned values sort like the numbers themselves. The
// width of int, uint and uintptr depends on the platform (8 bytes on 64-bit
// systems), so prefer sized types for records that leave the process.
//
// Encode allocates exactly width bytes and never fails. Decode allocates
// nothing on success and returns an error wrapping [ErrDecode] unless
// len(data) equals the width: a record of the wrong length was not written by
// this codec, and silently padding or truncating it would invent a value.
//
// The returned Codec is stateless, safe for concurrent use, and an
// [Appender].
func Int[T constraints.Integer]() Codec[T] {
	t := reflect.TypeFor[T]()
	return intCodec[T]{width: int(t.Size()), name: t.String()}
}

type intCodec[T constraints.Integer] struct {
	width int    // bytes per value, computed once
	name  string // type name for error messages
}

func (c intCodec[T]) Encode(v T) ([]byte, error) {
	return c.AppendEncode(make([]byte, 0, c.width), v)
}

func (c intCodec[T]) AppendEncode(dst []byte, v T) ([]byte, error) {
	// Converting to uint64 sign-extends signed values; keeping the low width
	// bytes then yields their two's complement form.
	u := uint64(v)
	for i := c.width - 1; i >= 0; i-- {
		dst = append(dst, byte(u>>(8*i)))
	}
	return dst, nil
}

func (c intCodec[T]) Decode(data []byte) (T, error) {
	if len(data) != c.width {
		return 0, fmt.Errorf("%w: %s: want %d bytes, got %d", ErrDecode, c.name, c.width, len(data))
	}
	var u uint64
	for _, b := range data {
		u = u<<8 | uint64(b)
	}
	// Converting truncates to T's width, which restores the sign of a
	// two's complement value.
	return T(u), nil
}
