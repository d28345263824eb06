package codec

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"reflect"
)

// Gob returns a Codec that uses encoding/gob.
//
// Each record is a complete, self-describing gob stream: Encode and Decode
// use a fresh gob.Encoder and gob.Decoder per call, so every record carries
// the description of its type. That makes records larger than a long-lived
// gob stream would, but each one decodes on its own, in any order and by any
// consumer, which a log requires. Encode returns a new slice trimmed to the
// record's length; Decode builds a new T that does not alias data. On error
// Decode returns the zero T rather than a partly filled one.
//
// Gob's own rules apply: only exported fields are sent, pointers are
// flattened, nil and empty slices and maps are not distinguished (both decode
// as nil), encoding a nil pointer is an error, and interface values need
// gob.Register. Bytes after the single encoded value are a decoding error.
//
// Gob is not safe for records from publishers you do not trust: whoever
// can publish to a topic can exhaust the memory or a CPU of every
// consumer. encoding/gob is not hardened against hostile input (its own
// documentation says so), and no wrapper can bound it without parsing the
// stream again. Measured on go1.26: a record no larger than an honest one
// (127 bytes in the review that found it) whose map count is forged makes Decode allocate
// 577 MiB for a count of 2^24 (memory grows with the count, not with the
// record), and keep a CPU busy for hours for a count of 2^40, even when T
// has no map at all (a field T lacks is skipped element by element); a
// forged count that runs out of input may still decode without an error. Use Gob only between processes you
// trust. For records from others, use JSON, whose decoder allocates in
// proportion to the record (every element is spelled out in it), or a Func
// codec whose format does.
//
// The returned Codec is stateless and safe for concurrent use.
func Gob[T any]() Codec[T] {
	return gobCodec[T]{name: reflect.TypeFor[T]().String()}
}

type gobCodec[T any] struct {
	name string // type name for error messages, computed once
}

func (c gobCodec[T]) Encode(v T) ([]byte, error) {
	// gob panics on a nil pointer rather than returning an error.
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
		return nil, fmt.Errorf("%w: gob %s: nil pointer", ErrEncode, c.name)
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return nil, fmt.Errorf("%w: gob %s: %w", ErrEncode, c.name, err)
	}
	// Copy out of the buffer: bytes.Buffer may hold up to twice the needed
	// capacity, and the log keeps this slice for the record's lifetime.
	return clone(buf.Bytes()), nil
}

func (c gobCodec[T]) Decode(data []byte) (T, error) {
	var v, zero T
	// bytes.Reader is an io.ByteReader, so gob reads from it directly without
	// buffering ahead, and r.Len() below counts exactly the unread bytes.
	r := bytes.NewReader(data)
	if err := gob.NewDecoder(r).Decode(&v); err != nil {
		return zero, fmt.Errorf("%w: gob %s: %w", ErrDecode, c.name, err)
	}
	if r.Len() != 0 {
		return zero, fmt.Errorf("%w: gob %s: %d trailing bytes", ErrDecode, c.name, r.Len())
	}
	return v, nil
}
