// Command signups shows logbus as a typed in-process event bus inside an
// application:
//
//	go run ./examples/signups
//
// A UserSignedUp event, keyed by user ID, is fanned out to three consumer
// groups on the topic "signups":
//
//   - email sends a welcome email (a plain Handler);
//   - audit records every signup, consuming through a Stream: deliveries
//     arrive on a channel and are acked one by one;
//   - analytics is a deliberately slow consumer, stalled on a gate that main
//     controls.
//
// "signups" has small partitions (4 records) with the Block policy, so while
// analytics is stalled a burst of signups fills them and Publish fails with
// ErrBackpressure after a short BlockTimeout. The producer sets those signups
// aside and publishes them again once analytics has caught up: nothing is
// lost, and TopicStats shows how many publishes were Blocked and TimedOut.
//
// A second topic, "signups.live", feeds a live dashboard that only cares
// about the latest signups. It uses DropOldest instead: Publish never waits,
// and while the dashboard is offline the oldest records are shed, counted in
// TopicStats.Dropped and in the dashboard group's Stats().Skipped.
//
// The output is the same on every run: the slow consumer is held by a channel,
// not by sleeping, so which publishes hit backpressure depends only on the
// keys, and everything is printed from main after Broker.Drain.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// UserSignedUp is the event the application publishes when a user signs up.
type UserSignedUp struct {
	UserID string `json:"user_id"`
	Email  string `json:"email"`
	Plan   string `json:"plan"` // "free" or "pro"
}

// blockTimeout is how long a Publish to a full "signups" partition waits
// for room before it gives up with ErrBackpressure. Short, so the demo is
// quick; the default is 1s.
const blockTimeout = 20 * time.Millisecond

func main() {
	log.SetFlags(0)
	ctx := context.Background()
	b := pubsub.NewBroker()

	// The durable bus: 2 partitions of at most 4 records each. Block makes a
	// full partition push back on the producer instead of losing records.
	signups, err := pubsub.NewTopic(b, "signups", codec.String(), codec.JSON[UserSignedUp](),
		pubsub.WithPartitions(2),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, OnFull: pubsub.Block, BlockTimeout: blockTimeout}))
	check(err)
	// The live feed: 1 partition of 4 records. DropOldest sheds old records
	// so that Publish never waits.
	live, err := pubsub.NewTopic(b, "signups.live", codec.String(), codec.JSON[UserSignedUp](),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, OnFull: pubsub.DropOldest}))
	check(err)

	email, audit, analytics, dashboard := newLog(), newLog(), newLog(), newLog()
	_, err = signups.Subscribe("email", "email-1", email.handler(nil))
	check(err)
	auditDone := streamAudit(signups, audit)
	gate := make(chan struct{}) // closed when analytics may go on
	analyticsGroup, err := signups.Subscribe("analytics", "analytics-1", analytics.handler(gate))
	check(err)
	dashboardGroup, err := live.Subscribe("dashboard", "dashboard-1", dashboard.handler(nil))
	check(err)
	// The dashboard is offline (say, being redeployed) for a while.
	check(dashboardGroup.Pause(ctx))
	fmt.Println("logbus signups demo: an in-process event bus with backpressure and shedding")

	section("burst: 10 signups while analytics is stalled")
	var rejected []UserSignedUp
	for _, u := range users() {
		if !publish(ctx, signups, u) {
			rejected = append(rejected, u) // try again once the consumer caught up
		}
	}
	fmt.Printf("signups stats: %+v\n", signups.Stats())
	fmt.Printf("  %d publishes found their partition full (Blocked), waited %v and gave up (TimedOut)\n",
		signups.Stats().Blocked, blockTimeout)
	fmt.Printf("analytics lag: %d (it holds the first record of each partition and commits nothing)\n",
		analyticsGroup.Lag())
	fmt.Println("  a partition frees records only once every group committed them:")
	fmt.Println("  the slowest group sets the pace for the producer")

	section("analytics catches up; the producer retries what was rejected")
	close(gate)
	check(b.Drain(ctx))
	for _, u := range rejected {
		if !publish(ctx, signups, u) {
			log.Fatalf("%s rejected again after analytics caught up", u.UserID)
		}
	}
	check(b.Drain(ctx))
	fmt.Printf("email sent %d welcome emails: %s\n", email.count(), strings.Join(email.sortedIDs(), " "))
	fmt.Printf("audit (a Stream) recorded %d signups\n", audit.count())
	fmt.Printf("analytics counted %d signups: %s\n", analytics.count(), analytics.plans())
	fmt.Printf("signups stats: %+v\n", signups.Stats())
	fmt.Println("  no signup was lost: every group got all 10, the 2 retried ones last")
	fmt.Println("  Reclaimed: once every group had committed them, full partitions freed records")

	section("shedding: signups.live drops the oldest instead of blocking")
	for _, u := range users() {
		// The live feed never pushes back: Publish returns at once.
		_, err := live.Publish(ctx, u.UserID, u)
		check(err)
	}
	// While the paused dashboard lags, Drain would report it at once
	// (ErrStalled) rather than wait for a group that cannot move.
	check(dashboardGroup.Resume(ctx)) // the dashboard comes back
	check(b.Drain(ctx))
	fmt.Printf("signups.live stats: %+v\n", live.Stats())
	fmt.Printf("dashboard stats: %+v\n", dashboardGroup.Stats())
	fmt.Printf("dashboard saw: %s\n", strings.Join(dashboard.sortedIDs(), " "))
	fmt.Println("  the 6 oldest were evicted before the dashboard read them: Dropped on the")
	fmt.Println("  topic, Skipped in the group; lossy but never silent, and never waiting")

	section("shutdown")
	closeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	check(b.Close(closeCtx))
	<-auditDone // Close closed the Stream's channel, so its loop ended
	fmt.Printf("Close returned nil; state=%s; the audit stream's channel was closed\n", b.State())
}

// users returns the ten signups of the burst. With 2 partitions, u01-u03,
// u08 and u09 hash to partition 0 and the others to partition 1: five each.
func users() []UserSignedUp {
	var out []UserSignedUp
	for i := 1; i <= 10; i++ {
		plan := "free"
		if i%2 == 0 {
			plan = "pro"
		}
		id := fmt.Sprintf("u%02d", i)
		out = append(out, UserSignedUp{UserID: id, Email: id + "@example.com", Plan: plan})
	}
	return out
}

// publish publishes u keyed by its user ID and prints the outcome. It
// reports false when the partition stayed full (ErrBackpressure): nothing
// was appended, and the caller decides what to do. Any other error is fatal.
func publish(ctx context.Context, t *pubsub.Topic[string, UserSignedUp], u UserSignedUp) bool {
	pos, err := t.Publish(ctx, u.UserID, u)
	switch {
	case errors.Is(err, pubsub.ErrBackpressure):
		fmt.Printf("%s -> rejected: ErrBackpressure, its partition stayed full for %v\n", u.UserID, blockTimeout)
		return false
	case err != nil:
		log.Fatal(err)
	}
	fmt.Printf("%s -> partition %d, offset %d\n", u.UserID, pos.Partition, pos.Offset)
	return true
}

// streamAudit consumes "signups" as the group "audit" through a Stream: the
// deliveries come on a channel, and each must be acked (or nacked) before its
// partition delivers the next one. The returned channel is closed when the
// stream's channel is, which Broker.Close does.
func streamAudit(t *pubsub.Topic[string, UserSignedUp], l *eventLog) <-chan struct{} {
	s, err := t.Stream("audit", "audit-1")
	check(err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range s.All() {
			l.add(d.Value)
			d.Ack()
		}
	}()
	return done
}

// eventLog collects what one group handled. Handlers of different partitions
// run concurrently, so it locks; main reads it only after Drain.
type eventLog struct {
	mu     sync.Mutex
	events map[string]UserSignedUp // by user ID: a redelivery is not counted twice
}

func newLog() *eventLog { return &eventLog{events: make(map[string]UserSignedUp)} }

// handler returns a handler that records each signup. With a non-nil gate
// it first waits for the gate to close: a consumer that is slow for as long
// as main wants, without any sleeping.
func (l *eventLog) handler(gate <-chan struct{}) pubsub.HandlerFunc[UserSignedUp] {
	return func(ctx context.Context, msg pubsub.Message[UserSignedUp]) error {
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done(): // Close gave up draining: return soon
				return ctx.Err()
			}
		}
		l.add(msg.Value)
		return nil
	}
}

func (l *eventLog) add(u UserSignedUp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events[u.UserID] = u
}

func (l *eventLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// sortedIDs returns the user IDs seen, sorted: the order across partitions
// is up to the scheduler.
func (l *eventLog) sortedIDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.events))
	for id := range l.events {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// plans counts the signups per plan.
func (l *eventLog) plans() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var free, pro int
	for _, u := range l.events {
		if u.Plan == "pro" {
			pro++
		} else {
			free++
		}
	}
	return fmt.Sprintf("free=%d pro=%d", free, pro)
}

func section(title string) { fmt.Printf("\n== %s ==\n", title) }

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
