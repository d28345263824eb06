package debughttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/logbus/logbus/pubsub"
)

// action is one POST: what to do to a group, or to a topic.
type action struct {
	kind  string // one of groupActions, or topicActions
	topic string
	group string       // "" for a topic's action
	from  pubsub.Start // replay: where from
	ids   []string     // redrive, discard: the dead letters' IDs; nil for all
}

// The actions, by the last segment of their paths.
var (
	groupActions = []string{"pause", "resume", "replay", "redrive", "discard", "delete"}
	topicActions = []string{"delete"}
)

// counts reports whether a answers how many dead letters it moved.
func (a action) counts() bool { return a.kind == "redrive" || a.kind == "discard" }

func (h *handler) serveAction(w http.ResponseWriter, r *http.Request) {
	a, known := actionOf(r)
	if !known {
		h.notFound(w, r, fmt.Sprintf("no action %q: want %s", a.kind, strings.Join(a.choices(), ", ")))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		h.fail(w, r, http.StatusMethodNotAllowed, r.Method+" is not allowed here: actions are POST requests")
		return
	}
	if !h.cfg.actions {
		h.fail(w, r, http.StatusForbidden, "actions are disabled: this page is read-only (debughttp.WithActions enables them)")
		return
	}
	if err := h.csrf.Check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, "refused: "+err.Error())
		return
	}
	if err := a.parseForm(r); err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.timeout)
	defer cancel()
	n, err := h.src.act(ctx, a)
	res := result{OK: true, Action: a.kind, Topic: a.topic, Group: a.group}
	if err != nil && a.kind == "delete" && deletedAnyway(err) {
		res.Note, err = "deleted; deliveries still running at the deadline finish in the background and commit nothing", nil
	}
	if err != nil {
		h.fail(w, r, statusOf(err), err.Error())
		return
	}
	if a.counts() {
		res.Count = &n
	}
	switch formatOf(r) {
	case formatJSON:
		writeJSON(w, http.StatusOK, res)
	case formatText:
		writeText(w, http.StatusOK, res.String())
	default:
		// Back to a page, relative to this URL so that it works under any
		// prefix: .../groups/{group}/{action} → .../groups/{group}, or
		// after deleting the group → .../topics/{topic}, and after
		// deleting a topic, /topics/{topic}/delete → the overview.
		q := url.Values{"done": {a.kind}}
		if res.Count != nil {
			q.Set("count", strconv.Itoa(n))
		}
		back := "../" + url.PathEscape(a.group)
		switch {
		case a.group == "":
			back, q["done"] = "../../", []string{"delete-topic"}
		case a.kind == "delete":
			back, q["done"] = "../../../"+url.PathEscape(a.topic), []string{"delete-group"}
		}
		w.Header().Set("Location", back+"?"+q.Encode())
		w.WriteHeader(http.StatusSeeOther)
	}
}

// actionOf reads the action the path names, and reports whether it is
// one.
func actionOf(r *http.Request) (action, bool) {
	a := action{kind: r.PathValue("action"), topic: r.PathValue("topic"), group: r.PathValue("group")}
	for _, k := range a.choices() {
		if k == a.kind {
			return a, true
		}
	}
	return a, false
}

// choices are the actions of a's path: a group's or a topic's.
func (a action) choices() []string {
	if a.group == "" {
		return topicActions
	}
	return groupActions
}

// parseForm reads the action's arguments from the form: for replay,
// from = earliest | latest | offset | time, with offset (a number) or time
// (RFC 3339); for redrive and discard, id (repeated) or all=1.
func (a *action) parseForm(r *http.Request) error {
	if err := r.ParseForm(); err != nil {
		return fmt.Errorf("bad form: %v", err)
	}
	switch a.kind {
	case "replay":
		switch from := r.PostForm.Get("from"); from {
		case "":
			// No default: a replay from the earliest record rewinds the
			// group, too much to do on a typo.
			return errors.New("replay: say where from: from=earliest, latest, offset (with offset=N) or time (with time=RFC 3339)")
		case "earliest":
			a.from = pubsub.Earliest()
		case "latest":
			a.from = pubsub.Latest()
		case "offset":
			n, err := strconv.ParseInt(strings.TrimSpace(r.PostForm.Get("offset")), 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("replay from offset: %q is not an offset", r.PostForm.Get("offset"))
			}
			a.from = pubsub.AtOffset(n)
		case "time":
			t, err := time.Parse(time.RFC3339, strings.TrimSpace(r.PostForm.Get("time")))
			if err != nil {
				return fmt.Errorf("replay from time: %q is not an RFC 3339 time", r.PostForm.Get("time"))
			}
			a.from = pubsub.AtTime(t)
		default:
			return fmt.Errorf("replay from %q: want earliest, latest, offset or time", from)
		}
	case "redrive", "discard":
		a.ids = r.PostForm["id"]
		switch {
		case len(a.ids) > 0 && r.PostForm.Get("all") != "":
			return fmt.Errorf("%s: give id or all, not both", a.kind)
		case len(a.ids) == 0 && r.PostForm.Get("all") == "":
			return fmt.Errorf("%s: say which dead letters (id) or all=1", a.kind)
		}
	}
	return nil
}

// result is an action's answer to a client that is not a browser.
type result struct {
	OK     bool   `json:"ok"`
	Action string `json:"action"`
	Topic  string `json:"topic"`
	Group  string `json:"group,omitempty"`
	Count  *int   `json:"count,omitempty"` // redrive, discard: the letters moved
	Note   string `json:"note,omitempty"`
}

func (r result) String() string {
	s := r.Action + ": done"
	switch r.Action {
	case "redrive":
		s = fmt.Sprintf("redrive: %d dead letter(s) sent back", *r.Count)
	case "discard":
		s = fmt.Sprintf("discard: %d dead letter(s) discarded", *r.Count)
	}
	if r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}

// notice is the line a page shows after an action redirected to it
// (?done=kind&count=n).
func notice(q url.Values) string {
	count, _ := strconv.Atoi(q.Get("count"))
	switch q.Get("done") {
	case "pause":
		return "Paused."
	case "resume":
		return "Resumed."
	case "replay":
		return "Replayed."
	case "redrive":
		return fmt.Sprintf("%d dead letter(s) sent back to the group.", max(count, 0))
	case "discard":
		return fmt.Sprintf("%d dead letter(s) discarded.", max(count, 0))
	case "delete-group":
		return "Group deleted."
	case "delete-topic":
		return "Topic deleted."
	}
	return ""
}

// deletedAnyway reports whether a deletion that returned err took place
// all the same: only its wait for the deliveries in flight ran out of
// time (Broker.DeleteGroup).
func deletedAnyway(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, pubsub.ErrUnavailable)
}

// statusOf maps an action's error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, pubsub.ErrTopicNotFound), errors.Is(err, pubsub.ErrSubscription), errors.Is(err, errNoLetter):
		return http.StatusNotFound
	case errors.Is(err, pubsub.ErrInvalid), errors.Is(err, pubsub.ErrOffsetOutOfRange):
		return http.StatusBadRequest
	case errors.Is(err, pubsub.ErrClosed):
		return http.StatusConflict
	case errors.Is(err, pubsub.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// errNoLetter is a redrive or discard naming only IDs the group holds no
// dead letter for.
var errNoLetter = errors.New("no such dead letter")
