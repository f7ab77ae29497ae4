"""The pages, one module per screen. Thin: reading goes through selectors and the card's
read model, writing through the engine.

Every button is a real form post. Without JavaScript it redirects back; with htmx the same view
answers with the fragment to swap, taken from the page template's partials.
"""
