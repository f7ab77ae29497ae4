"""The read side: what pages, the API, mail and chat show, read in a constant number of
queries (`selectors`: runs, timelines, audits; `briefs`: a gate as its approvers see it;
`live`: the versions open pages poll)."""
