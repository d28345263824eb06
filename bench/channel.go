package main

import (
	"sync"
)

// chanPeer is the baseline: buffered Go channels (1024), no library at all.
//
// Mapping: one channel per (group, partition), read by one goroutine.
//   - S1: one channel.
//   - S2: the producer sends each message to the 4 groups' channels in turn.
//     It sends the same slice to all four rather than a copy per channel:
//     the consumers only read it, and a copy per consumer would charge the
//     baseline with work that plain channels do not need. logbus's bytes
//     codec does copy per group (its Decode must not alias the stored
//     record), so this makes the baseline a lower bound, not a like-for-like.
//   - S3: producer p sends to channel p, read by consumer p.
//
// There is no ack: a message received is a message done.
type chanPeer struct{}

func (chanPeer) name() string { return "chan" }

func (chanPeer) run(sc scenario, n int) (result, error) {
	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)
	chans := make([][]chan []byte, sc.groups) // [group][partition]
	var consumers sync.WaitGroup
	for g := range sc.groups {
		chans[g] = make([]chan []byte, sc.partitions)
		for part := range sc.partitions {
			ch := make(chan []byte, 1024)
			chans[g][part] = ch
			// Ends when the channel is closed after the producers finish.
			consumers.Go(func() {
				for p := range ch {
					tr.deliver(g, p)
				}
			})
		}
	}

	var res result
	m := startMeter()
	err := runProducers(sc, n, func(p int, seq uint64) error {
		// A fresh slice per message: the consumer holds on to it, so the
		// producer cannot reuse a buffer.
		b := newPayload(seq, stamp)
		part := p % sc.partitions
		for g := range sc.groups {
			chans[g][part] <- b
		}
		return nil
	})
	if err == nil {
		err = tr.wait(*flagTimeout)
	}
	m.stop(&res)

	for g := range chans {
		for _, ch := range chans[g] {
			close(ch)
		}
	}
	consumers.Wait()
	tr.finish(&res)
	return res, err
}
