// Package codec turns typed values into bytes and back.
//
// A [Codec] is the boundary between a typed topic and the untyped log: the
// broker calls Encode once when a value is published and keeps the bytes
// as the stored record, and calls Decode for every consumer that reads the
// record. Because the log keeps, shares and reuses those bytes, every
// implementation keeps the rules [Codec] states; [RawBytes] is the one
// exception, for consumers that only read a value while it is delivered.
//
// Choosing a codec:
//
//   - [Bytes] and [String] for payloads that already are bytes or text.
//   - [RawBytes] for byte payloads that handlers only read during the call,
//     to save a copy per delivery.
//   - [Int] for integer keys, offsets and counters: fixed width, no
//     allocation beyond the result, and byte order matches numeric order for
//     unsigned types.
//   - [JSON] for structured values that people or other programs read; it is
//     the default choice for structs.
//   - [Gob] for Go-only structured values that JSON cannot represent, such
//     as NaN, infinities or maps keyed by structs; records are larger because
//     each one carries its own type description. Only between processes
//     that trust each other: a hostile record can exhaust a consumer's
//     memory or CPU (see [Gob]).
//   - [Func] to adapt any other format, such as protobuf.
//
// Every decoding error from this package wraps [ErrDecode] and every encoding
// error wraps [ErrEncode], so callers can classify failures with [errors.Is]
// without knowing which codec a topic uses. The underlying error, if any,
// stays reachable through [errors.As].
package codec

import (
	"errors"
	"fmt"
)

// A Codec turns values of T into bytes and back. The broker calls Encode
// once when a value is published and keeps the returned slice as the
// stored record (or, for an [Appender], has it appended to a buffer the log
// reuses), and calls Decode for every consumer that reads the record. So
// every implementation, including one built with [Func], must keep these
// rules:
//
//   - Encode must return a fresh slice that nothing else references, because
//     the log keeps it for the record's lifetime without copying.
//   - Decode must not retain data or return a value that aliases it, because
//     the stored bytes are shared by every consumer group, and (with an
//     Appender) reused for a later record once every group is past them;
//     a handler that mutates its value must not be able to change the
//     record for others. [RawBytes] is the one exception: it hands out the
//     stored bytes themselves, valid until the handler returns.
//   - Both must be safe for concurrent use: publishers and consumers call
//     them from many goroutines at once. Every codec in this package is
//     stateless, so it needs no lock.
type Codec[T any] interface {
	Encode(v T) ([]byte, error)
	Decode(data []byte) (T, error)
}

// An Appender is a Codec that can also encode into a buffer the caller
// already has. A topic whose codecs are Appenders encodes each record into
// the buffers of a record it freed earlier (one every group had committed
// past), so a steady stream of small records allocates nothing for their
// bytes. That reuse is safe only because of Decode's rule ([Codec]): no
// decoded value may share memory with the record it came from (or, for
// [RawBytes], outlive the handler it was given to).
//
// AppendEncode appends the encoding of v to dst and returns the extended
// slice, with the same bytes Encode would return; where Encode returns nil,
// it may return nil too, dropping dst ([Bytes] does, to keep a nil value
// apart from an empty one). Bytes, [RawBytes], [String] and [Int] are
// Appenders; [JSON], [Gob] and [Func] are not (they allocate their encoding
// anyway, so there is nothing to save).
type Appender[T any] interface {
	Codec[T]
	AppendEncode(dst []byte, v T) ([]byte, error)
}

// ErrEncode is wrapped by every error returned from Encode by the codecs in
// this package, so callers can tell encoding failures from other errors.
// Match it with [errors.Is], not ==: the returned errors add context to it.
var ErrEncode = errors.New("codec: cannot encode")

// ErrDecode is wrapped by every error returned from Decode by the codecs in
// this package, so callers can tell a malformed record from other failures.
// Match it with [errors.Is], not ==: the returned errors add context to it.
var ErrDecode = errors.New("codec: cannot decode")

// Func returns a Codec that calls encode and decode. It is the adapter for
// formats this package does not provide.
//
// The returned Codec is safe for concurrent use if encode and decode are. It
// passes slices through without copying, so the functions themselves must
// return a fresh slice from encode and must not retain or alias the data
// passed to decode ([Codec] says why).
//
// Errors from encode are wrapped with [ErrEncode] and errors from decode
// with [ErrDecode], unless they already wrap it; the original error stays
// reachable with [errors.Is] and [errors.As]. A nil encode or decode does
// not panic: the corresponding method returns an error wrapping ErrEncode
// or ErrDecode, so a misconfigured topic fails on use instead of at
// start-up. Panics raised by encode or decode are not recovered.
func Func[T any](encode func(T) ([]byte, error), decode func([]byte) (T, error)) Codec[T] {
	return funcCodec[T]{encode: encode, decode: decode}
}

type funcCodec[T any] struct {
	encode func(T) ([]byte, error)
	decode func([]byte) (T, error)
}

func (c funcCodec[T]) Encode(v T) ([]byte, error) {
	if c.encode == nil {
		return nil, fmt.Errorf("%w: codec.Func: nil encode function", ErrEncode)
	}
	b, err := c.encode(v)
	if err != nil {
		return nil, wrap(ErrEncode, err)
	}
	return b, nil
}

func (c funcCodec[T]) Decode(data []byte) (T, error) {
	var zero T
	if c.decode == nil {
		return zero, fmt.Errorf("%w: codec.Func: nil decode function", ErrDecode)
	}
	v, err := c.decode(data)
	if err != nil {
		return zero, wrap(ErrDecode, err)
	}
	return v, nil
}

// wrap makes err match sentinel without hiding err, and avoids repeating the
// sentinel's text when a custom codec already wrapped it.
func wrap(sentinel, err error) error {
	if errors.Is(err, sentinel) {
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}
