package codec

// Bytes returns the identity Codec for byte slices.
//
// Encode returns a copy of its input, so a caller that reuses or mutates its
// slice after publishing cannot change the stored record. Decode also returns
// a copy, so a handler that mutates its value cannot change the record seen by
// other consumer groups. Both copies have a capacity equal to their length,
// so a retained record holds no spare memory.
//
// Nil is preserved: a nil slice encodes to nil and decodes to nil, while an
// empty non-nil slice stays empty and non-nil in both directions. To keep
// that, AppendEncode returns nil for a nil value, whatever dst holds, and a
// non-nil slice for any other. No method fails.
//
// The returned Codec is stateless and safe for concurrent use.
//
// The Codec is an [Appender].
func Bytes() Codec[[]byte] {
	return bytesCodec{}
}

type bytesCodec struct{}

func (bytesCodec) Encode(v []byte) ([]byte, error) { return clone(v), nil }

func (bytesCodec) Decode(data []byte) ([]byte, error) { return clone(data), nil }

func (bytesCodec) AppendEncode(dst, v []byte) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	if dst == nil {
		dst = []byte{} // empty stays non-nil
	}
	return append(dst, v...), nil
}

// clone is bytes.Clone without the spare capacity bytes.Clone may add: the
// result of Encode lives as long as the record does.
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	c := make([]byte, len(b))
	copy(c, b)
	return c
}
