package jetstream

// Dead letters: each group's dead-letter stream (its letters part), how
// a letter is made to fit on the server and stored, and how letters are
// read back and discarded. A worker decides when a record is
// dead-lettered, and waits between stores (worker.deadLetter); the
// letters part stores it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// The headers of a dead letter, besides the record's own (recordHeaders).
const (
	hdrID        = "Lb-Id"
	hdrPartition = "Lb-Partition"
	hdrOffset    = "Lb-Offset"
	hdrCreated   = "Lb-Created"
	hdrAttempts  = "Lb-Attempts"
	hdrError     = "Lb-Error"
	hdrErrorKind = "Lb-Error-Kind"
	hdrFailedAt  = "Lb-Failed-At"
	// hdrTruncated says what a letter left out to fit on the server:
	// "value", or "record" (the value, the key and the headers);
	// hdrValueSize is then the value's length.
	hdrTruncated = "Lb-Truncated"
	hdrValueSize = "Lb-Value-Size"
)

// A letter's hdrErrorKind is [engine.DeadLetterKind] of its error, so that
// one read back by another process (or after a restart) still matches the
// right sentinel. Letters stored before it was named there say "failed"
// where it says [engine.KindExhausted], and read back the same.

// oneLine makes s fit in a header value.
func oneLine(s string) string {
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(s)
}

// MaxErrorText is how much of a dead letter's error text this engine
// stores, in bytes: a longer text is cut (at a character boundary) and
// ends with how many bytes were cut. It travels in a header, and the
// server refuses messages whose headers pass 64 KiB. The broker that made
// a letter keeps its whole error, for its own reads, until it closes.
const MaxErrorText = 4 << 10

// cutText cuts s to at most limit bytes, saying so at its end.
func cutText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	note := fmt.Sprintf(" [%d bytes cut]", len(s))
	cut := max(limit-len(note), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf(" [%d bytes cut]", len(s)-cut)
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

// unstoredError is how a dead letter the server would not store is
// reported (EventDeadLetter): the handler's error, which it wraps, and
// why the letter was not stored.
type unstoredError struct{ err, cause error }

func (e *unstoredError) Error() string {
	return e.err.Error() + " (the dead letter could not be stored, and was dropped: " + e.cause.Error() + ")"
}

func (e *unstoredError) Unwrap() error { return e.err }

// letterShape is what a dead letter keeps of its record.
type letterShape int8

const (
	wholeRecord letterShape = iota // value, key and headers
	noValue                        // key and headers
	noRecord                       // neither: the letter's own headers only
)

// letterSlack is kept free under the server's limits when a letter is
// shaped: Redrive's copy of a letter has a longer message ID.
const letterSlack = 64

// maxHeaderLen is the server's bound on a message's headers.
const maxHeaderLen = 64<<10 - 1

// letters is a group's dead-letter stream, and what this process keeps
// of the letters it made.
type letters struct {
	g   *group
	dlq natsjs.Stream

	mu   sync.Mutex       // guards errs and ids; never held across a server request
	errs map[string]error // dead letters this process made, by letter ID: their original errors
	ids  []string         // their IDs, oldest first: at most the dead-letter limit are kept

	// What was last read from the server (readCounts): how many letters
	// the stream holds, and how many were evicted.
	held, evicted seenInt64
}

// openLetters finds or creates the group's dead-letter stream.
func openLetters(ctx context.Context, g *group) (*letters, error) {
	dlq, err := g.stream(ctx, natsjs.StreamConfig{
		Name:      g.e.names.dlqStream(g.t.name, g.name),
		Subjects:  []string{g.e.names.dlqSubject(g.t.name, g.name)},
		Retention: natsjs.LimitsPolicy,
		MaxMsgs:   max(int64(g.spec.DeadLetterLimit), 1), // NoDeadLetters stores none (worker.deadLetter), and -1 is no limit here
		Discard:   natsjs.DiscardOld,
		// Read by batches of direct gets (scan).
		AllowDirect: true,
	})
	if err != nil {
		return nil, err
	}
	return &letters{g: g, dlq: dlq, errs: map[string]error{}}, nil
}

// countedFrom sets what the reads serve until they read the server
// themselves (readCounts), from the streams as opened: rst is the redrive
// stream's state.
func (l *letters) countedFrom(ctx context.Context, rst natsjs.StreamState) {
	dst := l.dlq.CachedInfo().State
	l.held.store(int64(dst.Msgs))
	l.evicted.store(max(0, int64(dst.LastSeq)-int64(dst.Msgs)-int64(rst.LastSeq)-l.discarded(ctx)))
}

// letterID names the dead letter of d: the record's ID, its delivery's
// consumer sequence and the time, so that a retried store of one letter
// is stored once (the server's duplicate window) and a record dead-
// lettered again later (after a Replay, or a redrive) is a letter of its
// own.
func letterID(d *engine.Delivery, md *natsjs.MsgMetadata) string {
	var cseq uint64
	if md != nil {
		cseq = md.Sequence.Consumer
	}
	return d.ID + "-" + strconv.FormatUint(cseq, 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// message is the dead letter of d's record, from msg, keeping what
// shape says.
func (l *letters) message(msg record, d *engine.Delivery, herr error, failedAt time.Time, shape letterShape) *nats.Msg {
	g := l.g
	dl := nats.NewMsg(g.e.names.dlqSubject(g.t.name, g.name))
	if shape == wholeRecord {
		dl.Data = msg.Data()
	}
	if shape != noRecord {
		for _, h := range recordHeaders {
			if v, ok := msg.Headers()[h]; ok {
				dl.Header[h] = v
			}
		}
	}
	dl.Header.Set(hdrID, d.ID)
	dl.Header.Set(hdrPartition, strconv.Itoa(d.Partition))
	dl.Header.Set(hdrOffset, strconv.FormatInt(d.Record.Offset, 10))
	dl.Header.Set(hdrCreated, d.Record.Created.Format(time.RFC3339Nano))
	dl.Header.Set(hdrAttempts, strconv.Itoa(d.Attempt))
	dl.Header.Set(hdrError, cutText(oneLine(herr.Error()), MaxErrorText))
	dl.Header.Set(hdrErrorKind, engine.DeadLetterKind(herr))
	dl.Header.Set(hdrFailedAt, failedAt.Format(time.RFC3339Nano))
	switch shape {
	case noValue:
		dl.Header.Set(hdrTruncated, "value")
	case noRecord:
		dl.Header.Set(hdrTruncated, "record")
	}
	if shape != wholeRecord {
		dl.Header.Set(hdrValueSize, strconv.Itoa(len(msg.Data())))
	}
	return dl
}

// fits reports whether dl, published under message ID id, is within the
// server's limits as this client knows them (its max_payload, 64 KiB of
// headers), with letterSlack to spare.
func (l *letters) fits(dl *nats.Msg, id string) bool {
	g := l.g
	h := headerLen(dl.Header) + len(natsjs.MsgIDHeader) + len(": \r\n") + len(id) + letterSlack
	limit := g.e.js.Conn().MaxPayload()
	return h <= maxHeaderLen && (limit <= 0 || int64(h+len(dl.Data)) <= limit)
}

// tooBig reports a publish refused for its size, by the client or the
// server.
func tooBig(err error) bool {
	var apiErr *natsjs.APIError
	return errors.Is(err, nats.ErrMaxPayload) || errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == natsjs.JSErrCodeStreamMessageExceedsMaximum || apiErr.ErrorCode == 10097) // header size exceeds maximum
}

// refused reports an error with which the server, or the client on its
// behalf, turned a request down: trying again as it is will not help.
// Anything else (a timeout, no responders, a lost connection, a 503) says
// the server could not be asked.
func refused(err error) bool {
	var apiErr *natsjs.APIError
	return tooBig(err) || errors.Is(err, nats.ErrBadHeaderMsg) || errors.Is(err, nats.ErrBadSubject) ||
		errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500
}

// store stores the dead letter of d's record in the group's
// dead-letter stream, under message ID id (so a retried store is stored
// once), counts it and reports it. The letter is shaped to fit on the
// server: its error text cut to [MaxErrorText]; without the record's value
// when the whole would pass the server's max_payload; also without its key
// and headers when the headers alone would pass 64 KiB (Truncated). A
// store the server refuses for its size is tried again at once in the
// next shape.
func (l *letters) store(ctx context.Context, msg record, d *engine.Delivery, herr error, consumer, id string) error {
	g := l.g
	now := time.Now()
	shape := wholeRecord
	dl := l.message(msg, d, herr, now, shape)
	for shape < noRecord && !l.fits(dl, id) {
		shape++
		dl = l.message(msg, d, herr, now, shape)
	}
	evicted := false
	l.mu.Lock()
	if _, ok := l.errs[id]; !ok {
		l.ids = append(l.ids, id)
		if len(l.ids) > g.spec.DeadLetterLimit { // the stream evicted that one too
			delete(l.errs, l.ids[0])
			l.ids = l.ids[1:]
			evicted = true
		}
	}
	l.errs[id] = herr
	l.mu.Unlock()
	for {
		_, err := g.e.js.PublishMsg(ctx, dl, natsjs.WithMsgID(id))
		if err == nil {
			break
		}
		if !tooBig(err) || shape == noRecord {
			return err
		}
		shape++
		dl = l.message(msg, d, herr, now, shape)
	}
	g.counts.deadLettered.Add(1) // before the Term, which Drain may see at once
	if obs := g.e.obs; obs != nil {
		// Before the Term too, so that whoever sees the commit (Drain) has
		// seen the event.
		letter := engine.DeadLetter{Record: d.Record, ID: d.ID, Topic: g.t.name, Partition: d.Partition, Group: g.name,
			Attempts: d.Attempt, Err: herr, FailedAt: now, Truncated: shape != wholeRecord}
		if letter.Truncated {
			letter.ValueSize = len(msg.Data())
		}
		ev := &engine.Event{Kind: engine.EventDeadLetter, Topic: g.t.name, Group: g.name, Consumer: consumer,
			Partition: d.Partition, Offset: d.Record.Offset, Attempt: d.Attempt, ID: d.ID, Letter: &letter, Err: herr}
		if evicted {
			ev.Count = 1
		}
		obs.Observe(ev)
	}
	return nil
}

// drop gives up storing the dead letter of d's record, which the
// server refused (cause), or which a group that keeps no dead letters
// (NoDeadLetters, cause nil) does not store: it is counted in DeadLettered
// and DeadLettersEvicted and reported by EventDeadLetter with Count 1
// (evicted) and, with a cause, an error that wraps the handler's and says
// why the letter was not stored.
func (l *letters) drop(d *engine.Delivery, herr, cause error, consumer, id string) {
	g := l.g
	l.forget(id)
	g.counts.deadLettered.Add(1)
	g.counts.dropped.Add(1)
	if obs := g.e.obs; obs != nil {
		err := herr
		if cause != nil {
			err = &unstoredError{err: herr, cause: cause}
		}
		letter := engine.DeadLetter{Record: d.Record, ID: d.ID, Topic: g.t.name, Partition: d.Partition, Group: g.name,
			Attempts: d.Attempt, Err: err, FailedAt: time.Now()}
		obs.Observe(&engine.Event{Kind: engine.EventDeadLetter, Topic: g.t.name, Group: g.name, Consumer: consumer,
			Partition: d.Partition, Offset: d.Record.Offset, Attempt: d.Attempt, ID: d.ID, Letter: &letter, Err: err, Count: 1})
	}
}

// forget drops what this process kept of a dead letter that left
// the stream (or never reached it), so that its eviction count stays true.
func (l *letters) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.errs[id]; !ok {
		return
	}
	delete(l.errs, id)
	if i := slices.Index(l.ids, id); i >= 0 {
		l.ids = slices.Delete(l.ids, i, i+1)
	}
}

// letter is the dead letter m of the group's dead-letter stream.
func (l *letters) letter(m *natsjs.RawStreamMsg) engine.DeadLetter {
	g := l.g
	h := m.Header
	offset, _ := strconv.ParseInt(h.Get(hdrOffset), 10, 64)
	created, _ := time.Parse(time.RFC3339Nano, h.Get(hdrCreated))
	rec, _ := decodeOrRaw(h, m.Data, uint64(offset)+1, created)
	partition, _ := strconv.Atoi(h.Get(hdrPartition))
	attempts, _ := strconv.Atoi(h.Get(hdrAttempts))
	failedAt, _ := time.Parse(time.RFC3339Nano, h.Get(hdrFailedAt))
	dl := engine.DeadLetter{Record: rec, ID: h.Get(hdrID), Topic: g.t.name, Partition: partition, Group: g.name,
		Attempts: attempts, FailedAt: failedAt}
	if h.Get(hdrTruncated) != "" {
		dl.Truncated = true
		dl.ValueSize, _ = strconv.Atoi(h.Get(hdrValueSize))
	}
	l.mu.Lock()
	dl.Err = l.errs[h.Get(natsjs.MsgIDHeader)]
	l.mu.Unlock()
	if dl.Err == nil {
		text := h.Get(hdrError)
		switch h.Get(hdrErrorKind) {
		case engine.KindDecode:
			dl.Err = &engine.DecodeError{Topic: g.t.name, Partition: partition, Offset: offset, Err: errors.New(text)}
		case engine.KindPanic:
			dl.Err = &engine.PanicError{Value: strings.TrimPrefix(text, "handler panicked: ")}
		default:
			dl.Err = &storedError{text: text, permanent: h.Get(hdrErrorKind) == engine.KindPermanent}
		}
	}
	return dl
}

// Reading the dead-letter stream: by batches of the server's direct gets
// (the stream allows them), each one request answered by up to
// letterBatch letters, at most letterBatchBytes of them, then an
// end-of-batch status. The newest letters are read first, a batch at a
// time from the last sequence backwards, so a read cut short has the
// newest.
const (
	letterBatch      = 512
	letterBatchBytes = 4 << 20
)

// directGet is the server's direct-get request, for a batch.
type directGet struct {
	Seq      uint64 `json:"seq"`
	Batch    int    `json:"batch"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// errNoDirect is a dead-letter stream that does not answer direct gets
// (made by an earlier version, and not yet updated by this one).
var errNoDirect = errors.New("the dead-letter stream does not allow direct gets")

// scan reads the dead letters with sequences from..to, oldest
// first, and calls yield for each until it returns false. Each batch is
// bounded by ctx, and by the request timeout when ctx has no deadline.
// It returns an error when the server did not answer in time or refused.
func (l *letters) scan(ctx context.Context, from, to uint64, yield func(*natsjs.RawStreamMsg) bool) error {
	g := l.g
	nc := g.e.js.Conn()
	// A synchronous subscription buffers a whole batch (up to 64 MiB and
	// its max_bytes is 4) while yield runs: a channel's would drop what
	// does not fit.
	sub, err := nc.SubscribeSync(nc.NewInbox())
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	subj := apiPrefix(g.e.js) + "DIRECT.GET." + g.e.names.dlqStream(g.t.name, g.name)
	for from <= to {
		req, _ := json.Marshal(directGet{Seq: from, Batch: int(min(to-from+1, letterBatch)), MaxBytes: letterBatchBytes})
		last, done := uint64(0), false
		err := g.e.boundedDo(ctx, func(ctx context.Context) error {
			if err := nc.PublishRequest(subj, sub.Subject, req); err != nil {
				return err
			}
			for {
				m, err := sub.NextMsgWithContext(ctx)
				if err != nil {
					return err
				}
				if len(m.Data) == 0 && m.Header.Get("Status") != "" {
					switch status := m.Header.Get("Status"); status {
					case "204": // the end of the batch
						return nil
					case "404": // nothing from `from` on
						done = true
						return nil
					case "503":
						return errNoDirect
					default:
						return fmt.Errorf("direct get: %s %s", status, m.Header.Get("Description"))
					}
				}
				seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
				if err != nil || seq > to || done {
					done = true // past to: the rest of the batch is read, not used
					continue
				}
				last = seq
				raw := &natsjs.RawStreamMsg{Subject: m.Header.Get("Nats-Subject"), Sequence: seq, Header: m.Header, Data: m.Data}
				raw.Time, _ = time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
				if !yield(raw) {
					done = true
					return nil
				}
			}
		})
		if errors.Is(err, errNoDirect) {
			return l.getLetters(ctx, from, to, yield)
		}
		if err != nil {
			return err
		}
		if done || last < from { // nothing more, or no progress
			return nil
		}
		from = last + 1
	}
	return nil
}

// getLetters is scan one request per letter, for a stream that
// does not allow direct gets.
func (l *letters) getLetters(ctx context.Context, from, to uint64, yield func(*natsjs.RawStreamMsg) bool) error {
	g := l.g
	for seq := from; seq <= to; seq++ {
		var m *natsjs.RawStreamMsg
		err := g.e.boundedDo(ctx, func(ctx context.Context) (err error) { m, err = l.dlq.GetMsg(ctx, seq); return err })
		if errors.Is(err, natsjs.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if !yield(m) {
			return nil
		}
	}
	return nil
}

// latest reads the group's newest n dead letters from the server, newest
// first: a batch at a time from the last sequence backwards. With an
// error it returns those it read.
func (l *letters) latest(ctx context.Context, n int) ([]engine.DeadLetter, error) {
	g := l.g
	var info *natsjs.StreamInfo
	if err := g.e.boundedDo(ctx, func(ctx context.Context) (err error) { info, err = l.dlq.Info(ctx); return err }); err != nil {
		return nil, g.e.ctxErr(ctx, fmt.Errorf("dead-letter stream: %w", err))
	}
	first, hi := max(info.State.FirstSeq, 1), info.State.LastSeq
	n = min(n, int(info.State.Msgs))
	out := make([]engine.DeadLetter, 0, n)
	var chunk []engine.DeadLetter
	for len(out) < n && hi >= first {
		want := n - len(out)
		lo := first
		if hi-first >= uint64(want) {
			lo = hi - uint64(want) + 1
		}
		chunk = chunk[:0]
		err := l.scan(ctx, lo, hi, func(m *natsjs.RawStreamMsg) bool {
			chunk = append(chunk, l.letter(m))
			return true
		})
		// The chunk is oldest first; letters removed meanwhile leave it
		// short, and the next chunk, further back, makes up for them.
		for i := len(chunk) - 1; i >= 0 && len(out) < n; i-- {
			out = append(out, chunk[i])
		}
		if err != nil {
			return out, g.e.ctxErr(ctx, fmt.Errorf("read %d of the newest %d dead letters: %w", len(out), n, err))
		}
		hi = lo - 1
	}
	return out, nil
}

// all reads the group's dead letters from the server, newest
// first by batches, and returns them oldest first, bounded by the request
// timeout. A read cut short (the server did not answer in time) returns
// the newest letters it read: fewer than GroupSnapshot.DeadLetters, the
// server's count, and LatestDeadLetters says why. Letters this process
// made carry their original error; others an error with the same text
// that matches the same sentinels: a [*engine.DecodeError], an
// [*engine.PanicError] (its Value the panic's text, no stack) or an error
// wrapping ErrPermanent. After Close it answers from what Close read;
// none once the group was deleted.
func (l *letters) all() []engine.DeadLetter {
	g := l.g
	if g.fate.gone() { // deleted: an empty group
		return nil
	}
	if s := g.seen.snap.Load(); s != nil {
		return slices.Clone(s.letters)
	}
	ctx, cancel := g.e.ctx()
	defer cancel()
	out, _ := l.latest(ctx, math.MaxInt)
	slices.Reverse(out)
	return out
}

// latestN returns the group's newest n dead letters, newest
// first ([engine.DeadLetterReader]), reading them from the last backwards
// by batches: its cost is in n, not in how many letters the group holds.
// ctx bounds it, and the request timeout each batch when ctx has no
// deadline; when either ends first (or the server refuses) it returns
// the letters it read, the newest, with an error saying how many of how
// many. n < 0 is ErrInvalid. It is a read, as DeadLetters is: after
// Close it answers from the letters Close read (the newest, when that
// read was cut short: then, when n asks for more, with an error wrapping
// ErrClosed).
func (l *letters) latestN(ctx context.Context, n int) ([]engine.DeadLetter, error) {
	g := l.g
	if n < 0 {
		return nil, fmt.Errorf("%w: dead letters: n is %d", engine.ErrInvalid, n)
	}
	if err := g.fate.err(); err != nil {
		return nil, err
	}
	if s := g.seen.snap.Load(); s != nil {
		out := make([]engine.DeadLetter, 0, min(n, len(s.letters)))
		for i := len(s.letters) - 1; i >= 0 && len(out) < n; i-- {
			out = append(out, s.letters[i])
		}
		if s.lettersErr != nil && len(out) < n {
			return out, fmt.Errorf("%w, and Close read only the newest %d dead letters (%v)", engine.ErrClosed, len(out), s.lettersErr)
		}
		return out, nil
	}
	if n == 0 {
		return nil, nil
	}
	return l.latest(ctx, n)
}

// discard removes the dead letters match accepts, every one
// when match is nil, and returns how many it removed
// ([engine.DeadLetterDiscarder]). With nil it purges the dead-letter
// stream up to its last letter when called, in one request (letters
// stored meanwhile stay); otherwise it reads the letters, oldest first by
// batches, calls match on each (on the caller's goroutine, under no lock)
// and deletes the ones it accepts, one request each. ctx bounds it, and
// the request timeout each request when ctx has no deadline; when either
// ends, the letters removed so far stay removed, are counted, and the
// error says so. Removed letters are not counted in DeadLettersEvicted:
// the group's count of them is kept on the server, in the deal bucket.
// After Close began it fails with ErrClosed.
func (l *letters) discard(ctx context.Context, match func(*engine.DeadLetter) bool) (n int, err error) {
	g := l.g
	if err := g.refuseWork("discard dead letters"); err != nil {
		return 0, err
	}
	defer func() {
		if n > 0 {
			l.countDiscarded(ctx, n)
		}
		if err != nil {
			err = g.e.ctxErr(ctx, fmt.Errorf("removed %d dead letters, then: %w", n, err))
		}
	}()
	var info *natsjs.StreamInfo
	if err := g.e.boundedDo(ctx, func(ctx context.Context) (err error) { info, err = l.dlq.Info(ctx); return err }); err != nil {
		return 0, err
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return 0, nil
	}
	if match == nil {
		purged, err := l.purge(ctx, last+1)
		if err == nil {
			l.mu.Lock()
			clear(l.errs)
			l.ids = nil
			l.mu.Unlock()
		}
		return purged, err
	}
	var delErr error
	err = l.scan(ctx, info.State.FirstSeq, last, func(m *natsjs.RawStreamMsg) bool {
		dl := l.letter(m)
		if !match(&dl) {
			return true
		}
		delErr = g.e.boundedDo(ctx, func(ctx context.Context) error { return l.dlq.DeleteMsg(ctx, m.Sequence) })
		switch {
		case delErr == nil:
			n++
			l.forget(m.Header.Get(natsjs.MsgIDHeader))
		case errors.Is(delErr, natsjs.ErrMsgNotFound): // taken meanwhile (a Redrive, another discard)
			delErr = nil
		default:
			return false
		}
		return true
	})
	return n, errors.Join(err, delErr)
}

// purge removes every dead letter below sequence before, and
// returns how many the server removed.
func (l *letters) purge(ctx context.Context, before uint64) (int, error) {
	g := l.g
	req, _ := json.Marshal(struct {
		Seq uint64 `json:"seq"`
	}{before})
	var resp struct {
		Purged uint64 `json:"purged"`
		Error  *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	err := g.e.boundedDo(ctx, func(ctx context.Context) error {
		m, err := g.e.js.Conn().RequestWithContext(ctx, apiPrefix(g.e.js)+"STREAM.PURGE."+g.e.names.dlqStream(g.t.name, g.name), req)
		if err != nil {
			return err
		}
		return json.Unmarshal(m.Data, &resp)
	})
	if err == nil && resp.Error != nil {
		err = fmt.Errorf("purge: %d %s", resp.Error.Code, resp.Error.Description)
	}
	return int(resp.Purged), err
}

// discardedKey is the key, in the deal bucket, of how many dead letters
// DiscardDeadLetters removed from the group, in any broker: Stats tells
// them from letters the stream's limit evicted with it. Its value is
// "<the dead-letter stream's creation time>:<count>", so that a count
// left by a deleted group of the same name is not taken for the new
// one's.
func (l *letters) discardedKey() string {
	return l.g.e.names.memberPrefix(l.g.t.name, l.g.name) + "discarded"
}

// created names the group's dead-letter stream by its creation time.
func (l *letters) created() string {
	return strconv.FormatInt(l.dlq.CachedInfo().Created.UnixNano(), 36)
}

// parseDiscarded reads a discardedKey value: the count, when it is the
// current dead-letter stream's.
func (l *letters) parseDiscarded(v []byte) int64 {
	created, count, ok := strings.Cut(string(v), ":")
	if !ok || created != l.created() {
		return 0
	}
	n, _ := strconv.ParseInt(count, 10, 64)
	return n
}

// countDiscarded adds n to the group's count of discarded letters
// (compare-and-set, so brokers discarding at once add up). Bounded by the
// request timeout; the count misses n if the server cannot be asked.
func (l *letters) countDiscarded(ctx context.Context, n int) {
	g := l.g
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.e.cfg.requestTimeout)
	defer cancel()
	value := func(was int64) []byte { return []byte(l.created() + ":" + strconv.FormatInt(was+int64(n), 10)) }
	for range 10 {
		e, err := g.e.deals.Get(ctx, l.discardedKey())
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
			_, err = g.e.deals.Create(ctx, l.discardedKey(), value(0))
		case err == nil:
			_, err = g.e.deals.Update(ctx, l.discardedKey(), value(l.parseDiscarded(e.Value())), e.Revision())
		}
		if err == nil || ctx.Err() != nil {
			return
		}
	}
}

// discarded reads the group's count of discarded letters: 0 when there
// is none, or the server cannot be asked.
func (l *letters) discarded(ctx context.Context) int64 {
	g := l.g
	e, err := g.e.deals.Get(ctx, l.discardedKey())
	if err != nil {
		return 0
	}
	return l.parseDiscarded(e.Value())
}

// readCounts reads, within r, how many dead letters the group holds and
// how many were evicted, into held and evicted.
func (l *letters) readCounts(r *reading) {
	g := l.g
	if !r.ask() || g.fate.gone() {
		return
	}
	// Every letter the stream ever stored is still there, evicted, taken
	// by Redrive, which stored one copy of it in the redrive stream (a
	// work queue: its last sequence counts every copy ever stored), or
	// removed by DiscardDeadLetters, which counts them in the deal bucket.
	info, err := l.dlq.Info(r.ctx)
	if !r.got(err) {
		return
	}
	l.held.store(int64(info.State.Msgs))
	gone := int64(info.State.LastSeq) - int64(info.State.Msgs)
	rinfo, err := g.redrive.rdq.Info(r.ctx)
	if !r.got(err) {
		return
	}
	gone -= int64(rinfo.State.LastSeq) + l.discarded(r.ctx)
	l.evicted.store(max(0, gone))
}
