# The payment service (cmd/payments) for docker-compose.yml, built from this repository.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /payments ./cmd/payments

FROM debian:bookworm-slim
COPY --from=build /payments /usr/local/bin/payments
USER 65534:65534
ENTRYPOINT ["payments"]
CMD ["serve"]
