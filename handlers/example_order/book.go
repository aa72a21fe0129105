package example_order

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
)

// Status is an order's state.
type Status string

// The states of an order: pending until its payment ends, then paid or cancelled for good.
const (
	StatusPending   Status = "pending"
	StatusPaid      Status = "paid"
	StatusCancelled Status = "cancelled"
)

// Order is an order of the book.
type Order struct {
	ID        string `json:"order_id"`
	PaymentID string `json:"payment_id"`
	Status    Status `json:"status"`
	// CreatedBy is the id of the order.created message that created it: its redelivery
	// publishes the payment request again, another message with the same order id does not.
	CreatedBy string `json:"created_by,omitempty"`
}

// ErrBookClosed is returned by a change to a closed book.
var ErrBookClosed = errors.New("example_order: book is closed")

// Book holds the orders. With a file it appends every change, synced, before returning,
// and OpenBook replays the file; without one it lives in memory. It is safe for
// concurrent use.
type Book struct {
	mu        sync.Mutex
	orders    map[string]Order
	counts    map[Status]int
	conflicts int
	file      *os.File
	closed    bool
}

// NewBook returns an empty book kept in memory.
func NewBook() *Book {
	return &Book{orders: map[string]Order{}, counts: map[Status]int{}}
}

// OpenBook returns the book kept in the file at path (JSON lines, created when missing),
// with the orders it already holds.
func OpenBook(path string) (*Book, error) {
	b := NewBook()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open order book: %w", err)
	}
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		var o Order
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			// A line cut by a crash mid-write can only be the last one; its change was
			// never acknowledged, so its event is redelivered.
			continue
		}
		b.put(o)
	}
	if err := sc.Err(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("read order book %s at line %d: %w", path, line, err)
	}
	b.file = f
	return b, nil
}

func (b *Book) put(o Order) {
	if old, ok := b.orders[o.ID]; ok {
		b.counts[old.Status]--
	}
	b.orders[o.ID] = o
	b.counts[o.Status]++
}

// write records o, in the file first. b.mu is held.
func (b *Book) write(o Order) error {
	if b.closed {
		return ErrBookClosed
	}
	if b.file != nil {
		line, err := json.Marshal(o)
		if err != nil {
			return fmt.Errorf("encode order %q: %w", o.ID, err)
		}
		if _, err := b.file.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("write order %q: %w", o.ID, err)
		}
		if err := b.file.Sync(); err != nil {
			return fmt.Errorf("sync order %q: %w", o.ID, err)
		}
	}
	b.put(o)
	return nil
}

// create records o as pending unless the book knows its id; it returns the book's order.
func (b *Book) create(o Order) (Order, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.orders[o.ID]; ok {
		return old, false, nil
	}
	o.Status = StatusPending
	if err := b.write(o); err != nil {
		return Order{}, false, err
	}
	return o, true, nil
}

// settle moves a pending order to status; it returns the order as it now is, and whether
// it was known. An order already settled otherwise is a conflict and keeps its state.
func (b *Book) settle(id string, status Status) (Order, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.orders[id]
	switch {
	case !ok:
		return Order{}, false, nil
	case o.Status == status:
		return o, true, nil
	case o.Status != StatusPending:
		b.conflicts++
		return o, true, nil
	}
	o.Status = status
	if err := b.write(o); err != nil {
		return Order{}, true, err
	}
	return o, true, nil
}

// Order returns the order with id, and whether the book knows it.
func (b *Book) Order(id string) (Order, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.orders[id]
	return o, ok
}

// Count returns how many orders are in status.
func (b *Book) Count(status Status) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts[status]
}

// Conflicts returns how many outcome events contradicted an order's end state (a
// payment.succeeded for a cancelled order, or a payment.failed for a paid one) since the
// book was opened. They are ignored: the first outcome wins.
func (b *Book) Conflicts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.conflicts
}

// Close closes the book's file; later changes fail with ErrBookClosed.
func (b *Book) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if b.file != nil {
		return b.file.Close()
	}
	return nil
}
