package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/dlqwire"
)

// headerList is a repeatable flag of headers: K=V for --set-header, K for --unset-header.
type headerList []string

func (l *headerList) String() string { return strings.Join(*l, ",") }

func (l *headerList) Set(v string) error {
	if v == "" {
		return errors.New("empty header")
	}
	*l = append(*l, v)
	return nil
}

const dlqEditAbout = `Corrects one dead-lettered message and replays it: publishes a copy to its
original queue (as replay does: retry state reset; message id, correlation id,
trace context and failure history kept) with the new payload and headers, and
x-sluice-edited-at, x-sluice-edited-by (your OS user@host) and
x-sluice-original-sha256 (the old payload's SHA-256) added; and moves the
original, unchanged, to Q.dlq.archive. Both in one AMQP transaction: the
original is never lost. Prints the id it replayed.

The new payload comes from --payload-file F (- for standard input) or from
--editor, which opens $VISUAL or $EDITOR (default vi) on the current payload
(JSON pretty-printed). A message whose content type is JSON must get a payload
that parses. Limits: payload 1 MiB, header value 4 KiB; sluice's and RabbitMQ's
own headers (retry state, failure record, message id, trace context, x-death)
cannot be set or unset. The edit is recorded in the audit trail (sluice audit).
Exit codes: 2 for a refused edit (nothing changed), 3 when the id is no longer
in Q.dlq.

` + compensatedAbout

func runDLQEdit(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "edit", "--queue Q --id ID (--payload-file F | --editor) [--set-header K=V]... [--unset-header K]... [--compensated] [--json]", dlqEditAbout)
	id := f.fs.String("id", "", "edit the message with this `ID` (required)")
	payloadFile := f.fs.String("payload-file", "", "read the new payload from `F` (- for standard input)")
	editor := f.fs.Bool("editor", false, "edit the current payload in $VISUAL or $EDITOR")
	var set, unset headerList
	f.fs.Var(&set, "set-header", "set header `K=V` on the copy (repeatable)")
	f.fs.Var(&unset, "unset-header", "remove header `K` from the copy (repeatable)")
	compensated := f.fs.Bool(compensatedFlag, false, compensatedUsage)
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	if *id == "" {
		return f.usageErrorf("--id is required")
	}
	if *payloadFile != "" && *editor {
		return f.usageErrorf("--payload-file and --editor exclude each other")
	}
	edit := dlq.Edit{ID: *id, UnsetHeaders: unset}
	for _, kv := range set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return f.usageErrorf("--set-header wants K=V, got %q", kv)
		}
		if edit.SetHeaders == nil {
			edit.SetHeaders = map[string]string{}
		}
		edit.SetHeaders[k] = v
	}
	if *payloadFile != "" {
		p, err := readPayload(*payloadFile)
		if err != nil {
			return err
		}
		edit.Payload = p
	}
	conn, err := connect(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	if *editor {
		recs, err := dlq.Inspector{Conn: conn}.Show(ctx, f.queue, *id)
		if err != nil {
			return dlqError(err)
		}
		rec := recs[0] // the copy Edit takes: the oldest
		p, err := editPayload(e, rec.Payload)
		if err != nil {
			return err
		}
		if bytes.Equal(p, rec.Payload) && len(set) == 0 && len(unset) == 0 {
			return &codeError{code: exitUsage, err: fmt.Errorf("sluice dlq edit: payload unchanged and no header given: nothing edited")}
		}
		edit.Payload = p
	}
	if err := dlqwire.CheckEdit(edit.ID, edit.Payload, edit.SetHeaders, edit.UnsetHeaders); err != nil {
		return &codeError{code: exitUsage, err: err}
	}
	res, err := dlq.Operator{Conn: conn, Now: e.now}.Edit(ctx, f.queue, edit, dlq.Options{Compensated: *compensated})
	if f.json {
		out := struct {
			dlq.EditResult
			Error string `json:"error,omitempty"`
		}{EditResult: res}
		if err != nil {
			out.Error = err.Error()
		}
		if jerr := writeJSON(e, out); jerr != nil && err == nil {
			err = jerr
		}
	} else if err == nil {
		fmt.Fprintf(e.stdout, "edited %s: replayed to %s as id %s; the original (sha256 %s) is in %s\n",
			*id, res.Destination, res.ID, res.OriginalSHA256, res.Archive)
		if res.Compensated > 0 {
			fmt.Fprintf(e.stdout, "its compensation event had been published (confirmed with --%s): the work it undid is redone\n", compensatedFlag)
		}
	}
	if errors.Is(err, dlq.ErrEditRefused) {
		return &codeError{code: exitUsage, err: err, quiet: f.json}
	}
	return opError(err)
}

func readPayload(path string) ([]byte, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("sluice dlq edit: payload file: %w", err)
		}
		defer f.Close()
		r = f
	}
	// One byte past the limit, so that Validate names an oversized payload.
	p, err := io.ReadAll(io.LimitReader(r, dlqwire.MaxEditPayload+1))
	if err != nil {
		return nil, fmt.Errorf("sluice dlq edit: read payload %s: %w", path, err)
	}
	return p, nil
}

// editPayload opens $VISUAL or $EDITOR (default vi) on payload and returns what was saved.
func editPayload(e *env, payload []byte) ([]byte, error) {
	editor := e.getenv("VISUAL")
	if editor == "" {
		editor = e.getenv("EDITOR")
	}
	if editor == "" {
		editor = "vi"
	}
	dir, err := os.MkdirTemp("", "sluice-edit-")
	if err != nil {
		return nil, fmt.Errorf("sluice dlq edit: %w", err)
	}
	defer os.RemoveAll(dir)
	name := "payload.txt"
	shown := payload
	var pretty bytes.Buffer
	if json.Valid(payload) && json.Indent(&pretty, payload, "", "  ") == nil {
		name, shown = "payload.json", append(pretty.Bytes(), '\n')
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, shown, 0o600); err != nil {
		return nil, fmt.Errorf("sluice dlq edit: %w", err)
	}
	// Through the shell, as git runs $EDITOR: it may carry arguments ("code --wait").
	cmd := exec.Command("/bin/sh", "-c", editor+` "$1"`, "sh", path)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, e.stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("sluice dlq edit: editor %q: %w (nothing edited)", editor, err)
	}
	edited, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sluice dlq edit: %w", err)
	}
	if bytes.Equal(edited, shown) {
		return payload, nil // untouched: keep the original bytes, not the pretty-printed ones
	}
	return edited, nil
}
