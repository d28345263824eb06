package jetstream

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/logbus/logbus/internal/engine"
	"github.com/logbus/logbus/pubsub"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// The kinds of error a dead letter records, so that one read back by
// another process (or after a restart) still matches the right sentinel.
const (
	kindPermanent = "permanent"
	kindPanic     = "panic"
	kindDecode    = "decode"
	kindFailed    = "failed"
)

func errorKind(err error) string {
	var pe *engine.PanicError
	var de *pubsub.DecodeError
	switch {
	case errors.As(err, &de):
		return kindDecode
	case errors.As(err, &pe):
		return kindPanic
	case errors.Is(err, engine.ErrPermanent):
		return kindPermanent
	}
	return kindFailed
}

// oneLine makes s fit in a header value.
func oneLine(s string) string {
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(s)
}

// storedError is a dead letter's error read back from the server: its
// text, wrapping ErrPermanent when the original did.
type storedError struct {
	text      string
	permanent bool
}

func (e *storedError) Error() string { return e.text }

func (e *storedError) Unwrap() error {
	if e.permanent {
		return engine.ErrPermanent
	}
	return nil
}

// DeadLetters reads the group's dead-letter stream, oldest first, bounded
// by the request timeout (what it could not read is left out). Letters
// this process made carry their original error; others an error with the
// same text that matches the same sentinels: a *pubsub.DecodeError, an
// *engine.PanicError (its Value the panic's text, no stack) or an error
// wrapping ErrPermanent.
func (g *group) DeadLetters() []engine.DeadLetter {
	if s := g.snap.Load(); s != nil {
		return slices.Clone(s.letters)
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	info, err := g.dlq.Info(ctx)
	if err != nil || info.State.Msgs == 0 {
		return nil
	}
	out := make([]engine.DeadLetter, 0, info.State.Msgs)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := g.dlq.GetMsg(ctx, seq)
		if errors.Is(err, natsjs.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			break
		}
		out = append(out, g.letter(m))
	}
	return out
}

func (g *group) letter(m *natsjs.RawStreamMsg) engine.DeadLetter {
	h := m.Header
	offset, _ := strconv.ParseInt(h.Get(hdrOffset), 10, 64)
	created, _ := time.Parse(time.RFC3339Nano, h.Get(hdrCreated))
	rec, err := decodeRecord(h, m.Data, uint64(offset)+1, created)
	if err != nil {
		rec = &engine.Record{Offset: offset, Value: m.Data, Created: created}
	}
	partition, _ := strconv.Atoi(h.Get(hdrPartition))
	attempts, _ := strconv.Atoi(h.Get(hdrAttempts))
	failedAt, _ := time.Parse(time.RFC3339Nano, h.Get(hdrFailedAt))
	dl := engine.DeadLetter{Record: rec, ID: h.Get(hdrID), Topic: g.t.name, Partition: partition, Group: g.name,
		Attempts: attempts, FailedAt: failedAt}
	g.mu.Lock()
	dl.Err = g.letters[h.Get("Nats-Msg-Id")]
	g.mu.Unlock()
	if dl.Err == nil {
		text := h.Get(hdrError)
		switch h.Get(hdrErrorKind) {
		case kindDecode:
			dl.Err = &pubsub.DecodeError{Topic: g.t.name, Partition: partition, Offset: offset, Err: errors.New(text)}
		case kindPanic:
			dl.Err = &engine.PanicError{Value: strings.TrimPrefix(text, "handler panicked: ")}
		default:
			dl.Err = &storedError{text: text, permanent: h.Get(hdrErrorKind) == kindPermanent}
		}
	}
	return dl
}
