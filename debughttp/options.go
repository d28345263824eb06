package debughttp

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/logbus/logbus/pubsub"
)

// Option configures the Handler. An invalid option does not panic: see
// Handler.
type Option interface{ apply(*config) }

type config struct {
	actions  bool
	payloads bool
	redact   map[string]bool // header names to redact, lower-case
	hosts    map[string]bool // names allowed in Host besides the default ones (hostname)
	refresh  time.Duration
	letters  int
	timeout  time.Duration // bound on one action
	nils     int           // nil options given
	badNames int           // empty names given to WithRedactedHeaders
	badHosts int           // empty names given to WithAllowedHosts
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithActions enables the buttons that change a group or a topic: Pause,
// Resume, Replay (from the earliest or latest record, an offset or a
// time), Redrive and Discard (its dead letters, one or all), Delete group
// and Delete topic. Off by default: the page is then read-only.
func WithActions() Option { return optionFunc(func(c *config) { c.actions = true }) }

// WithPayloads shows the first bytes of each dead letter's key and value
// (at most 256, as text when they are printable UTF-8, else as hex) and
// its headers, in the pages and the JSON. Off by default: the pages then
// show sizes only, since a message's bytes and headers often carry
// personal data or credentials that the people who may look at a queue's
// state may not see.
//
// Even with WithPayloads, the values of the headers named Authorization,
// Proxy-Authorization, Cookie and Set-Cookie, and of those named with
// [WithRedactedHeaders], read "[redacted]". A dead letter's error is shown
// either way (its first KiB): it is the handler's text, and should not
// quote secrets.
func WithPayloads() Option { return optionFunc(func(c *config) { c.payloads = true }) }

// WithRedactedHeaders adds header names whose values [WithPayloads] must
// not show, to those it always redacts (Authorization,
// Proxy-Authorization, Cookie, Set-Cookie). Names match without regard to
// case. An empty name is invalid (ErrInvalid, see Handler).
func WithRedactedHeaders(names ...string) Option {
	return optionFunc(func(c *config) {
		for _, n := range names {
			if n == "" {
				c.badNames++
				continue
			}
			c.redact[strings.ToLower(n)] = true
		}
	})
}

// WithAllowedHosts adds host names that requests may name in their Host
// header when [WithActions] or [WithPayloads] is on, besides localhost, the
// names under .localhost and IP addresses, which are always allowed; see
// the package doc for why. Names match without regard to case, and a port
// given with a name is ignored (any port is allowed). An empty name is
// invalid (ErrInvalid, see Handler).
func WithAllowedHosts(names ...string) Option {
	return optionFunc(func(c *config) {
		for _, n := range names {
			if h := hostname(n); h != "" {
				c.hosts[h] = true
				continue
			}
			c.badHosts++
		}
	})
}

// WithRefresh sets how often the open page refreshes its figures,
// overriding the default of 2s; 0 turns refreshing off, and a negative d
// is invalid (ErrInvalid, see Handler).
func WithRefresh(d time.Duration) Option { return optionFunc(func(c *config) { c.refresh = d }) }

// WithDeadLetters sets how many of each group's newest dead letters the
// pages show, overriding the default of 20. They are read with
// [pubsub.Group.LatestDeadLetters], which neither copies nor decodes the
// others; 0 shows none (the counts stay), and a negative n is invalid
// (ErrInvalid, see Handler).
func WithDeadLetters(n int) Option { return optionFunc(func(c *config) { c.letters = n }) }

func newConfig(opts []Option) (config, error) {
	c := config{refresh: 2 * time.Second, letters: 20, timeout: 5 * time.Second, redact: map[string]bool{
		"authorization": true, "proxy-authorization": true, "cookie": true, "set-cookie": true,
	}, hosts: map[string]bool{}}
	for _, o := range opts {
		if o == nil {
			c.nils++
			continue
		}
		o.apply(&c)
	}
	return c, c.validate()
}

// validate checks the options' values; its error wraps [pubsub.ErrInvalid].
func (c *config) validate() error {
	var errs []error
	if c.nils > 0 {
		errs = append(errs, errors.New("a nil Option"))
	}
	if c.badNames > 0 {
		errs = append(errs, errors.New("WithRedactedHeaders: an empty name"))
	}
	if c.badHosts > 0 {
		errs = append(errs, errors.New("WithAllowedHosts: an empty name"))
	}
	if c.refresh < 0 {
		errs = append(errs, fmt.Errorf("WithRefresh(%v): negative", c.refresh))
	}
	if c.letters < 0 {
		errs = append(errs, fmt.Errorf("WithDeadLetters(%d): negative", c.letters))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("debughttp: %w: %w", pubsub.ErrInvalid, errors.Join(errs...))
}
