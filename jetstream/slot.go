package jetstream

// The slot state machine: one partition of a group in this broker, as its
// workers, Pause, Seek, Replay, Redrive, the snapshot and the stuck
// watchdog see it.
//
// A slot outlives workers: a pause or a reposition holds the slot
// whichever member's worker runs it, and a record a stopping worker
// fetched waits in the slot for the next local worker. Its worker moves it
// through the phases below; everyone else holds it (hold, unhold), resets
// it (bumpEpoch) or waits on it (waitIdle). Every change is signalled on
// changed, which a waiter selects on with its own stop: a slot never
// blocks anyone under its lock.

import (
	"context"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/kit"
)

// phase is what a partition's worker is doing.
type phase int8

const (
	parked   phase = iota // waiting at the gate, or between pulls
	fetching              // a pull is open on the server
	holding               // it holds a fetched record it may not deliver yet
	busy                  // a handler runs
)

// slot is one partition of a group in this broker.
type slot struct {
	p int

	mu      sync.Mutex    // guards every field below but worker; never held across a server request or user code
	holds   int           // Pause and repositions under way: no delivery may start
	epoch   uint64        // bumped by every reset of the consumer: a record fetched before is dropped
	phase   phase         // of the current worker
	revoked chan struct{} // closed when a hold begins or the worker must stop; the Delivery's Revoked
	changed chan struct{} // closed and replaced on every change of the above

	// next is the stream sequence the partition should deliver next, 0
	// until it has delivered one: a record past it means retention took
	// the ones between before the group read them (counted as Skipped).
	next uint64

	// pending is a record a stopping worker fetched but did not deliver,
	// handed to the partition's next local worker (no redelivery), with
	// the epoch it was fetched in.
	pending      record
	pendingEpoch uint64

	// What the snapshot tells of the partition's delivery: a handler runs
	// (inFlight), or the last attempt failed and the server will deliver
	// the record again after its backoff (retrying); attempt is that
	// delivery's. Local: a delivery in another broker is not seen.
	inFlight, retrying bool
	attempt            int

	// With key concurrency (keys.go), the window as its worker last showed
	// it: keyed while one runs, the deliveries in flight (running), the
	// oldest unsettled offset (-1 when none) and its record (heldRec, for
	// the stuck watchdog). inFlight, retrying and attempt then describe
	// that oldest record.
	keyed   bool
	running int
	oldest  int64
	heldRec *engine.Record
	// keyKept is the window a stopping worker left to the partition's
	// next local worker (keys.go).
	keyKept *keyState

	// Redrive (redrive.go): redriveGen counts the reasons to look at the
	// partition's redrive consumer (a Redrive, a wake-up, a new worker);
	// redriveSeen is the count when a worker last found it empty.
	redriveGen, redriveSeen uint64

	// For stuck detection (stuck.go): starts counts the deliveries begun,
	// and offset and consumer say whose record the one in flight is.
	starts   uint64
	offset   int64
	consumer string

	// puller is the partition's pull subscription, made by its first
	// worker and used by one worker at a time; closed by Close. rpuller
	// is the same for the partition's redrive consumer.
	puller  *puller
	rpuller *puller

	worker *worker // the partition's worker in this broker; guarded by the membership's mu, not by mu
}

func newSlot(p int) *slot {
	return &slot{p: p, oldest: -1, revoked: make(chan struct{}), changed: make(chan struct{})}
}

// signal wakes whoever waits on the slot. s.mu must be held.
func (s *slot) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// setPhaseLocked moves the worker to ph and says so. s.mu must be held.
func (s *slot) setPhaseLocked(ph phase) {
	s.phase = ph
	s.signal()
}

func (s *slot) setPhase(ph phase) {
	s.mu.Lock()
	s.setPhaseLocked(ph)
	s.mu.Unlock()
}

// revoke closes the current Revoked channel once. s.mu must be held.
func (s *slot) revoke() {
	select {
	case <-s.revoked:
	default:
		close(s.revoked)
	}
}

// renewRevokedLocked gives the next delivery a fresh Revoked channel when
// the current one was closed: a revocation is spent once its hold ended.
// s.mu must be held.
func (s *slot) renewRevokedLocked() {
	select {
	case <-s.revoked:
		s.revoked = make(chan struct{})
	default:
	}
}

// startLocked marks a delivery begun (busy) and returns its Revoked
// channel. s.mu must be held.
func (s *slot) startLocked() <-chan struct{} {
	s.setPhaseLocked(busy)
	return s.revoked
}

// waitLocked waits for the slot to change, or for stop or tick, with s.mu
// released meanwhile; it reports whether tick fired. s.mu must be held,
// and is held again when it returns.
func (s *slot) waitLocked(stop <-chan struct{}, tick <-chan time.Time) (ticked bool) {
	ch := s.changed
	s.mu.Unlock()
	select {
	case <-ch:
	case <-stop:
	case <-tick:
		ticked = true
	}
	s.mu.Lock()
	return ticked
}

// claim readies the slot for a new worker: it looks for redriven letters
// first (a previous owner may have left some), and gets a fresh Revoked
// unless a hold is under way.
func (s *slot) claim() {
	s.mu.Lock()
	s.redriveGen++
	if s.holds == 0 {
		s.renewRevokedLocked()
	}
	s.mu.Unlock()
}

// stopWorker revokes the current delivery and wakes the worker, which is
// stopping.
func (s *slot) stopWorker() {
	s.mu.Lock()
	s.revoke()
	s.signal()
	s.mu.Unlock()
}

func (s *slot) hold() {
	s.mu.Lock()
	s.holds++
	s.revoke()
	s.signal()
	s.mu.Unlock()
}

func (s *slot) unhold() {
	s.mu.Lock()
	s.holds--
	s.signal()
	s.mu.Unlock()
}

// bumpEpoch records a reset of the consumer to seq: a record fetched
// before is dropped.
func (s *slot) bumpEpoch(seq uint64) {
	s.mu.Lock()
	s.epoch++
	s.next = seq
	s.signal()
	s.mu.Unlock()
}

// currentEpoch returns the epoch a record fetched now belongs to.
func (s *slot) currentEpoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// moved reports whether the consumer was reset since epoch.
func (s *slot) moved(epoch uint64) bool { return s.currentEpoch() != epoch }

// keep keeps msg, fetched in epoch, for the partition's next local
// delivery.
func (s *slot) keep(msg record, epoch uint64) {
	s.mu.Lock()
	s.pending, s.pendingEpoch = msg, epoch
	s.mu.Unlock()
}

// takeKept removes and returns what a stopping worker kept for the next
// local worker, if anything: a record, or a window (keys.go).
func (s *slot) takeKept() (record, uint64, *keyState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg, epoch, st := s.pending, s.pendingEpoch, s.keyKept
	s.pending, s.keyKept = nil, nil
	return msg, epoch, st
}

// settled moves next past d's record.
func (s *slot) settled(d *engine.Delivery) {
	s.mu.Lock()
	if seq := uint64(d.Record.Offset) + 1; s.next == seq {
		s.next = seq + 1
	}
	s.mu.Unlock()
}

// settledTo moves next past the record at seq, which a batch settled.
func (s *slot) settledTo(seq uint64) {
	s.mu.Lock()
	s.next = seq + 1
	s.mu.Unlock()
}

// begin records that consumer's delivery of the record at stream sequence
// seq begins, on attempt, and returns the sequence it expected next when
// records were skipped in between (retention took them): 0 when none
// were.
func (s *slot) begin(seq uint64, attempt int, consumer string) (skippedFrom uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next != 0 && seq > s.next {
		skippedFrom = s.next
	}
	s.next = seq
	s.beginLocked(int64(seq)-1, attempt, consumer)
	return skippedFrom
}

// beginLocked records, for the snapshot and the stuck watchdog, that
// consumer's delivery of the record at offset begins, on attempt. s.mu is
// held.
func (s *slot) beginLocked(offset int64, attempt int, consumer string) {
	s.inFlight, s.retrying, s.attempt = true, false, attempt
	s.starts, s.offset, s.consumer = s.starts+1, offset, consumer
}

// ended records that the delivery ended, and whether its failed record
// will be retried.
func (s *slot) ended(retrying bool) {
	s.mu.Lock()
	s.inFlight, s.retrying = false, retrying
	s.mu.Unlock()
}

// retryingStore shows the partition Retrying on attempt while its dead
// letter waits to be stored again, until the returned func is called.
func (s *slot) retryingStore(attempt int) (done func()) {
	s.mu.Lock()
	s.retrying, s.attempt = true, attempt
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.retrying = false
		s.mu.Unlock()
	}
}

// progressLocked is the slot's delivery as the watchdog samples it. s.mu
// is held.
func (s *slot) progressLocked() kit.Progress {
	return kit.Progress{Word: s.starts, InFlight: s.inFlight, Attempt: s.attempt}
}

func (s *slot) busyNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase == busy
}

// waitIdle waits until no handler runs on the slot and, with
// notFetching, no pull is open either, or until ctx ends.
func (s *slot) waitIdle(ctx context.Context, notFetching bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.phase == busy || notFetching && s.phase == fetching {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.waitLocked(ctx.Done(), nil)
	}
	return nil
}

// wantRedrive makes the slot's worker look at its redrive consumer before
// its next pull.
func (s *slot) wantRedrive() {
	s.mu.Lock()
	s.redriveGen++
	s.signal()
	s.mu.Unlock()
}

// wantsRedrive reports whether the worker must look at the redrive
// consumer. s.mu must be held.
func (s *slot) wantsRedrive() bool { return s.redriveGen != s.redriveSeen }

// lookedForRedrive records that the worker found the redrive consumer
// empty at generation gen, unless a Redrive came since.
func (s *slot) lookedForRedrive(gen uint64) {
	s.mu.Lock()
	if s.redriveGen == gen {
		s.redriveSeen = gen
	}
	s.mu.Unlock()
}

// pullerFor returns the slot's puller, or with redrive its redrive
// puller, made by mk on first use (only the slot's worker makes one).
func (s *slot) pullerFor(redrive bool, mk func() (*puller, error)) (*puller, error) {
	s.mu.Lock()
	field := &s.puller
	if redrive {
		field = &s.rpuller
	}
	p := *field
	s.mu.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := mk()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	*field = p
	s.mu.Unlock()
	return p, nil
}

// pullers returns the slot's pull subscriptions made so far.
func (s *slot) pullers() (p, rp *puller) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puller, s.rpuller
}

// closePullers ends the slot's pull subscriptions, for Close, once the
// workers stopped (or Close gave up on them: their pulls then end at
// once).
func (s *slot) closePullers() {
	p, rp := s.pullers()
	if p != nil {
		p.close()
	}
	if rp != nil {
		rp.close()
	}
}
