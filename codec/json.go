package codec

import (
	"encoding/json"
	"fmt"
	"reflect"
)

// JSON returns a Codec that uses encoding/json.
//
// Encode returns the slice from json.Marshal, which is freshly allocated on
// every call. Decode unmarshals into a new T; encoding/json copies strings and
// base64-decodes byte slices, so the value never aliases data. On error Decode
// returns the zero T rather than a partly filled one.
//
// Decoding follows json.Unmarshal: unknown fields are ignored and field names
// match case-insensitively, so a record survives its struct gaining or losing
// fields. Trailing data after the value is an error. A round trip is exact
// only for values JSON can represent: encoding fails for channels, functions,
// NaN and infinities, invalid UTF-8 in strings becomes U+FFFD, and interface
// fields come back as JSON's generic types (float64, map[string]any, ...).
//
// The returned Codec is stateless and safe for concurrent use.
func JSON[T any]() Codec[T] {
	return jsonCodec[T]{name: reflect.TypeFor[T]().String()}
}

type jsonCodec[T any] struct {
	name string // type name for error messages, computed once
}

func (c jsonCodec[T]) Encode(v T) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: json %s: %w", ErrEncode, c.name, err)
	}
	return b, nil
}

func (c jsonCodec[T]) Decode(data []byte) (T, error) {
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		var zero T
		return zero, fmt.Errorf("%w: json %s: %w", ErrDecode, c.name, err)
	}
	return v, nil
}
