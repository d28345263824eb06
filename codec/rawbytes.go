package codec

// RawBytes returns a Codec for byte slices whose Decode does not copy: the
// slice a handler gets is the log's own memory, as a
// [database/sql.RawBytes] is the driver's. It is for consumers that only
// read a value during the call that delivers it, such as one that parses
// the bytes or writes them on to a file or a socket, and it saves the
// allocation and the copy that [Bytes] makes for every delivery.
//
// It is the one exception to Decode's rule ([Codec]), and it puts this
// rule in its place: a decoded value is valid until the handler that got
// it returns (a Stream delivery's, until it is acked or nacked or its
// Stream closes), and nobody may write to it. After that the log may reuse
// its memory for a later record. So a handler that keeps a
// value, or passes it to another goroutine, must copy it first
// (bytes.Clone), and a test that records the values it receives must use
// Bytes. A handler that writes to a value changes what the other consumer
// groups read. Such misuse is a data race with the log's own use of the
// memory, which the race detector usually reports.
//
// The decoded slice's capacity equals its length, so appending to it
// copies instead of writing into the log's memory. Encoding is Bytes': it
// copies, nil and empty stay apart both ways, no method fails, and the
// Codec is an [Appender]. It is stateless and safe for concurrent use.
func RawBytes() Codec[[]byte] {
	return rawBytesCodec{}
}

type rawBytesCodec struct{ bytesCodec }

func (rawBytesCodec) Decode(data []byte) ([]byte, error) {
	return data[:len(data):len(data)], nil // nil stays nil: slicing nil gives nil
}
