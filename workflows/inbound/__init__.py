"""Mail that comes in: replies to a gate's mail that approve or reject it.

`replies.receive` is the one handler, for a message piped by the deployment's mail server
(`manage.py receive_mail`) and for the hosted services' webhooks (django-anymail's inbound
signal, `anymail_inbound`). `authenticity` says whom a message is vouched for (DKIM, or a
relay the deployment trusts); `reading` says what a reply asks (its first line) and what is
no reply at all (an auto-reply, a forward)."""
