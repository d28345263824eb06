package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// watermillPeer runs watermill's in-memory gochannel Pub/Sub, with Ack.
//
// gochannel has no partitions and no consumer groups: every subscriber of a
// topic gets every message. The mapping is therefore:
//   - S1: one topic, one subscriber.
//   - S2: one topic, four subscribers (each plays one group).
//   - S3: four topics, one per producer, each with one subscriber: a topic
//     stands for a partition, and the four subscribers together for the
//     group of four consumers that share the partitions.
//
// Publish does not wait for delivery: it starts a goroutine per message
// which waits its turn for the subscriber and then for the Ack. There is no
// backpressure, so a fast producer piles up goroutines (one per message in
// flight); that cost is part of what is measured. The order of delivery is
// not guaranteed either, which the tracker does not need.
type watermillPeer struct{}

func (watermillPeer) name() string       { return "watermill" }
func (watermillPeer) traits() traits     { return traits{slow: true} }
func (watermillPeer) topic(p int) string { return "bench-" + strconv.Itoa(p) }

func (w watermillPeer) run(sc scenario, n int) (result, error) {
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024, Persistent: false}, watermill.NopLogger{})
	ctx, cancel := context.WithCancel(context.Background())
	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)

	// One subscription per (group, topic): a topic per partition.
	var consumers sync.WaitGroup
	var subErr error
	for g := range sc.groups {
		for part := range sc.partitions {
			msgs, err := gc.Subscribe(ctx, w.topic(part))
			if err != nil {
				subErr = err
				break
			}
			// Ends when gochannel closes the output channel (ctx
			// cancelled or gc.Close).
			consumers.Go(func() {
				for m := range msgs {
					tr.deliver(g, m.Payload)
					m.Ack()
				}
			})
		}
	}

	var res result
	err := subErr
	if err == nil {
		m := startMeter()
		err = runProducers(sc, n, func(p int, seq uint64) error {
			// A fresh payload per message: gochannel's Publish copies the
			// message but shares the payload slice with every subscriber.
			// The UUID is the sequence number: unique, and cheaper than
			// watermill.NewUUID, which would charge watermill for an ID
			// scheme the benchmark does not need.
			msg := message.NewMessage(strconv.FormatUint(seq, 10), newPayload(seq, stamp))
			return gc.Publish(w.topic(p%sc.partitions), msg)
		})
		if err == nil {
			err = tr.wait(*flagTimeout)
		}
		m.stop(&res)
	}

	// Cancelling the subscriptions' context and closing gc ends the
	// subscription goroutines and closes the output channels, which ends
	// ours. Every message was acked, so the per-message goroutines have
	// returned or are returning.
	cancel()
	if cerr := gc.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	consumers.Wait()
	tr.finish(&res)
	return res, err
}
